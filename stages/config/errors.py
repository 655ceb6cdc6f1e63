"""ConfigError: the one error of the paths config and the files it names
(wg-quick), so both raise it without importing each other."""
from __future__ import annotations


class ConfigError(Exception):
    """A config file (or a --via name) that vpnw cannot use.

    str() names the file, the line when there is one, what is wrong and how to
    fix it. The CLI turns it into exit code 121.
    """

    def __init__(self, problem: str, fix: str, *, file: str | None = None,
                 line: int | None = None):
        self.problem = problem
        self.fix = fix
        self.file = file
        self.line = line
        super().__init__(str(self))

    def __str__(self) -> str:
        where = ""
        if self.file is not None:
            where = f"{self.file}:{self.line}: " if self.line else f"{self.file}: "
        # The same shape as a policy error: file:line: problem; fix: ...
        return f"{where}{self.problem}; fix: {self.fix}"
