"""A cheap check, at data-set load, that every listed image can be read.

mmcv's ``LoadImageFromFile`` names the path of an image it cannot decode, but a
0-byte file fails inside OpenCV with no path at all, and a missing one only
when its batch comes up. One ``os.stat`` per image at load time (microseconds
each on a local disk) names the listing line instead.
"""
import os


def check_image_file(img_path: str, where: str) -> None:
    """Raise naming ``where`` (e.g. ``split.txt:12``) if ``img_path`` is
    missing or empty. Remote paths (URLs) are left to the loader."""
    if '://' in img_path:
        return
    try:
        size = os.stat(img_path).st_size
    except FileNotFoundError:
        raise FileNotFoundError(f'{where}: image not found: {img_path!r}') from None
    if size == 0:
        raise ValueError(f'{where}: image file is empty (0 bytes): {img_path!r}')
