"""A cheap check, at data-set load, that every listed image can be read: a
0-byte file fails inside OpenCV with no path, a missing one only when its batch
comes up; one ``os.stat`` per image names the listing line instead."""
import os

from moppa_mm.utils.errors import InputNotFoundError, InputValueError


def check_image_file(img_path: str, where: str) -> None:
    """Raise naming ``where`` (e.g. ``split.txt:12``) if ``img_path`` is
    missing or empty. Remote paths (URLs) are left to the loader."""
    if '://' in img_path:
        return
    try:
        size = os.stat(img_path).st_size
    except FileNotFoundError:
        raise InputNotFoundError(f'{where}: image not found: {img_path!r}') from None
    if size == 0:
        raise InputValueError(f'{where}: image file is empty (0 bytes): {img_path!r}')
