"""The errors the CLI prints as one located line, no traceback: a user's mistake
(InputError, exit code 2) and a run that could not go on through no mistake of theirs
(RunError, exit code 1: a store that went away)."""

from __future__ import annotations

from pathlib import Path


class InputError(Exception):
    """Bad input, located: ``error: <file>: <location>: <what>``.

    ``location`` is a JSON path such as ``data[3].paragraphs[7].qas[2].id``, a line number
    (``line 12``) or a params key; it may be empty when the whole file is at fault.
    """

    exit_code = 2

    def __init__(self, file: str | Path, location: str, what: str) -> None:
        self.file = str(file)
        self.location = location
        self.what = what
        super().__init__(self.line())

    def __reduce__(self) -> tuple[type[InputError], tuple[str, str, str]]:
        # rebuilt from its three parts: an error raised in a Ray worker reaches the driver
        # whole (Exception's default pickling would call __init__ with one argument)
        return type(self), (self.file, self.location, self.what)

    def line(self) -> str:
        parts = [self.file] + ([self.location] if self.location else []) + [self.what]
        return "error: " + ": ".join(parts)


class RunError(InputError):
    """A run stopped by its surroundings (the checkpoint store unreachable), located like an
    InputError and printed the same way, but not the user's mistake: exit code 1."""

    exit_code = 1
