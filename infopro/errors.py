"""Errors a user can cause, reported as one line and a non-zero exit (see `infopro.cli`).

Anything else that escapes is a bug in this repository and keeps its traceback.
"""


class InfoProError(Exception):
    """Bad input a user can fix: the message says what was wrong and what is valid."""

    exit_code = 2


class DataError(InfoProError):
    """Missing, corrupt or unexpected data files."""


class RunDirError(InfoProError):
    """An output directory that holds a different or unfinished run."""


class DivergedError(InfoProError):
    """A non-finite loss; the last good checkpoint is kept."""

    exit_code = 3
