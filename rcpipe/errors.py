"""The one error type a user's mistake raises: the CLI prints it as one line and exits 2."""

from __future__ import annotations

from pathlib import Path


class InputError(Exception):
    """Bad input, located: ``error: <file>: <location>: <what>``.

    ``location`` is a JSON path such as ``data[3].paragraphs[7].qas[2].id``, a line number
    (``line 12``) or a params key; it may be empty when the whole file is at fault.
    """

    def __init__(self, file: str | Path, location: str, what: str) -> None:
        self.file = str(file)
        self.location = location
        self.what = what
        super().__init__(self.line())

    def line(self) -> str:
        parts = [self.file] + ([self.location] if self.location else []) + [self.what]
        return "error: " + ": ".join(parts)
