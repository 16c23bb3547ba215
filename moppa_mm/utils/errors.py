"""The marker of the project's verdicts on a user's input.

:class:`MoPPAInputError` is mixed into every exception class that says what is
wrong with a config, a checkpoint or a data path the user handed us
(``CheckpointLoadError``, ``PretrainedMismatchError``, ...; each keeps its
built-in base, so ``except RuntimeError`` still catches it). Our tools print
such an error as one line and exit with status 1; any other exception (a bug,
an upstream library's error) keeps its traceback. ``MOPPA_TRACEBACK=1`` shows
the traceback of ours too.
"""
import os
import sys
from typing import NoReturn

TRACEBACK_ENV = 'MOPPA_TRACEBACK'


class MoPPAInputError(Exception):
    """Marker base: the error names a problem of the user's input, and its
    message is the whole story (no traceback needed)."""


class InputValueError(MoPPAInputError, ValueError):
    """A config value that cannot work (named with its key)."""


class InputNotFoundError(MoPPAInputError, FileNotFoundError):
    """A file or folder the config or the command line names is missing."""


def show_traceback() -> bool:
    """Whether the user asked for the traceback of our own errors too."""
    return os.getenv(TRACEBACK_ENV, '0').lower() in ('1', 'y', 'yes', 'true')


def stop(tool: str, error: BaseException) -> NoReturn:
    """Exit with status 1 and ``<tool>: <message>`` on stderr."""
    sys.exit(f'{tool}: {error}')
