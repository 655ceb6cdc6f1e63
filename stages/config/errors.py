"""The errors of vpnw's own files: ConfigError, the one error of the paths
config and the files it names (wg-quick), so both raise it without
importing each other; PolicyError, the policy file's, raised by its
loading (policy.py) and by the parsing of its words (policy_file.py,
policy_tables.py, policy_problems.py)."""
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


class PolicyError(Exception):
    """A policy that cannot be used. str() is the whole message for the user,
    one `file:line: problem; fix: ...` sentence a line."""

    def __init__(self, message: str, *, source: str | None = None, line: int | None = None):
        super().__init__(message)
        self.source = source
        self.line = line
