"""What runs outside the sandbox later, and so is out of the program's reach
inside, always (docs/security.md, "Nothing planted inside runs outside later").

    protect(inputs)  ->  Protection: read_only (bound read-only by init),
                                     hidden (secrets: an empty mount over them),
                                     absent (not there at start: checked after the run),
                                     lifted (named in allow_write: left writable, said so)

The program runs as the user, so without a limit it can write whatever the
user can. Some of those files run code outside the sandbox when the user next
acts, or decide what the next run does: vpnw's own installation, its state
and the files its policy and config name, the shell's start-up files, git's
hooks and configuration (core.fsmonitor, core.hooksPath, core.sshCommand run
code), ssh's config, rc and authorized_keys, user services and autostart
entries, editors' start-up files. They are read-only for the program whether
or not the policy has `[files]`; a policy lifts one only by naming that very
path in allow_write (a wider path such as `~` or `.` does not).

Starts from the mandatory-deny list of Anthropic's sandbox-runtime and the
protected paths of Codex (`.git` under each writable root), and goes further.

Pure but for the look-ups it is given (`locate`, `read_text`), so the tests
can pass a file system of their own.
"""
from __future__ import annotations

import os

from stages.config.records import NamedTuple  # typing's, without importing typing

# Home-relative: start-up files of shells, sessions, services, git, ssh and
# editors. Each names something that runs, or decides what runs, outside.
HOME_START_UP = {
    "shell start-up": (
        ".profile", ".bashrc", ".bash_profile", ".bash_login", ".bash_logout", ".bash_aliases",
        ".zshenv", ".zprofile", ".zshrc", ".zlogin", ".zlogout", ".kshrc", ".mkshrc",
        ".cshrc", ".tcshrc", ".login", ".logout", ".inputrc", ".config/fish",
        ".pam_environment", ".config/environment.d"),
    "session start-up": (".xprofile", ".xinitrc", ".xsession", ".xsessionrc",
                         ".config/autostart"),
    "user services": (".config/systemd", ".local/share/systemd"),
    "git configuration": (".gitconfig", ".config/git"),
    "ssh configuration": (".ssh/config", ".ssh/rc", ".ssh/environment",
                          ".ssh/authorized_keys", ".ssh/authorized_keys2"),
    "editor start-up": (".vimrc", ".config/nvim", ".emacs", ".emacs.d/init.el",
                        ".tmux.conf", ".config/tmux", ".npmrc"),
}
# Relative to each writable tree vpnw knows (the start directory, allow_write
# directories): tools and agents run these when the user next works there.
TREE_START_UP = (".vscode", ".idea", ".mcp.json", ".claude/settings.json",
                 ".claude/settings.local.json", ".claude/commands", ".claude/agents")
PROJECT = "project start-up"
# Inside a repository's git directory: what git runs (hooks) or is told to run
# (config: core.fsmonitor, core.hooksPath, core.sshCommand, aliases, filters).
GIT_DIR_START_UP = ("hooks", "config")
# The machine's name look-ups: the broker, outside, reads /etc/hosts.
NAME_LOOKUP = ("/etc/hosts", "/etc/resolv.conf")


class Protected(NamedTuple):
    """A path kept out of the program's reach, and why."""
    path: str          # absolute, symlinks resolved
    why: str           # what it is, for the record and the messages
    kind: str          # "dir" | "file" | "absent"


class Protection(NamedTuple):
    """What one run keeps read-only or hidden."""
    read_only: tuple[Protected, ...]
    hidden: tuple[Protected, ...]
    absent: tuple[Protected, ...]
    lifted: tuple[Protected, ...]

    def to_helper(self) -> "HelperProtection":
        return HelperProtection(read_only=tuple(p.path for p in self.read_only),
                                hide=tuple((p.path, p.kind) for p in self.hidden))

    def to_record(self, budget: int = 2400) -> dict:
        """run.start's "protected": the paths by what they are (what fits in
        `budget` characters; the rest counted)."""
        out: dict = {}
        unlisted = 0
        for key, entries in (("hidden", self.hidden), ("lifted", self.lifted),
                             ("read_only", self.read_only), ("absent", self.absent)):
            shown = []
            for p in entries:
                if budget < len(p.path):
                    unlisted += 1
                    continue
                budget -= len(p.path) + 3
                shown.append(p.path)
            out[key] = shown
        if unlisted:
            out["unlisted"] = unlisted
        return out


class Inputs(NamedTuple):
    """What protect() looks at."""
    homes: tuple[str, ...]                 # the invoker's home first (sudo: the user's too)
    cwd: str
    install: tuple[str, ...] = ()          # vpnw's interpreter, sys.path, package
    evidence: tuple[str, ...] = ()         # state dir, record, policy, config, log
    named: tuple[str, ...] = ()            # files the config names (CA files...)
    secrets: tuple[str, ...] = ()          # secret files the config names (hidden)
    signing_key: tuple[str, ...] = ()      # vpnw's keys/ directory (hidden: docs/security.md)
    allow_write: tuple[str, ...] = ()      # the policy's allow_write, resolved
    writable_trees: tuple[str, ...] = ()   # allow_write directories


def protect(inputs: Inputs, locate, read_text) -> Protection:
    """locate(path) -> (realpath, kind); read_text(path) -> str | None (small files)."""
    wanted: list[tuple[str, str]] = []
    wanted += [(p, "vpnw's installation") for p in inputs.install]
    wanted += [(p, "vpnw's evidence") for p in inputs.evidence]
    wanted += [(p, "a file the config names") for p in inputs.named]
    wanted += [(p, "the machine's name look-ups") for p in NAME_LOOKUP]
    for home in inputs.homes:
        for why, names in HOME_START_UP.items():
            wanted += [(os.path.join(home, n), why) for n in names]
    for tree in dict.fromkeys((inputs.cwd, *inputs.writable_trees)):
        wanted += [(os.path.join(tree, n), PROJECT) for n in TREE_START_UP]
        for git_dir in git_dirs(tree, locate, read_text):
            wanted += [(os.path.join(git_dir, n), "git hooks and configuration")
                       for n in GIT_DIR_START_UP]
    secrets = {locate(p)[0]: p for p in inputs.secrets}
    keys = {locate(p)[0]: p for p in inputs.signing_key}
    lift = set(inputs.allow_write)
    read_only, absent, lifted, seen = [], [], [], set(secrets) | set(keys)
    for path, why in wanted:
        real, kind = locate(path)
        if real in seen:
            continue
        seen.add(real)
        entry = Protected(real, why, kind)
        if real in lift:
            lifted.append(entry)
        elif kind == "absent":
            # A project gains these legitimately (an agent's own settings, an
            # editor's folder): only what exists is protected there.
            if why != PROJECT:
                absent.append(Protected(os.path.normpath(path), why, kind))
        else:
            read_only.append(entry)
    hidden = []
    for real, path in secrets.items():
        kind = locate(path)[1]
        if kind != "absent":
            hidden.append(Protected(real, "a secret the config names", kind))
    for real, path in keys.items():
        if locate(path)[1] == "dir":
            hidden.append(Protected(real, "vpnw's signing key", "dir"))
    return Protection(_outermost(read_only), tuple(hidden), tuple(absent), tuple(lifted))


def _outermost(entries: list[Protected]) -> tuple[Protected, ...]:
    """One bind per tree: a path inside another read-only one is covered."""
    out: list[Protected] = []
    for e in sorted(entries, key=lambda e: (len(e.path), e.path)):
        if not any(e.path == o.path or e.path.startswith(o.path.rstrip("/") + "/")
                   for o in out if o.kind == "dir"):
            out.append(e)
    return tuple(out)


def git_dirs(tree: str, locate, read_text) -> list[str]:
    """The git directories of the repository `tree` is in (git looks upward
    from the working directory) and of one at its top: `.git` directories, or
    what a `.git` file ("gitdir: ...") names, with its common directory."""
    found: list[str] = []
    here = tree
    while True:
        real, kind = locate(os.path.join(here, ".git"))
        if kind == "dir":
            found.append(real)
        elif kind == "file":
            found += _linked_git_dirs(here, real, locate, read_text)
        if kind != "absent" or here == "/":
            break
        here = os.path.dirname(here)
    return list(dict.fromkeys(found))


def _linked_git_dirs(top: str, dot_git: str, locate, read_text) -> list[str]:
    text = read_text(dot_git) or ""
    if not text.startswith("gitdir:"):
        return []
    named = text[len("gitdir:"):].strip()
    git_dir, kind = locate(os.path.join(top, named))
    if kind != "dir":
        return []
    out = [git_dir]
    common = (read_text(os.path.join(git_dir, "commondir")) or "").strip()
    if common:
        real, kind = locate(os.path.join(git_dir, common))
        if kind == "dir":
            out.append(real)
    return out


def read_small(path: str, limit: int = 4096) -> str | None:
    """The start of a small file (a `.git` file, `commondir`), or None."""
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode("utf-8", "replace")
    except OSError:
        return None


def installation(executable: str, sys_path: list[str], prefix: str, base_prefix: str,
                 package_dir: str, entry_script: str | None) -> tuple[str, ...]:
    """vpnw's installation as its interpreter sees it: the interpreter, every
    directory its imports come from, a venv's whole prefix (pyvenv.cfg names
    the interpreter), the `stages` package and the `vpnw` script."""
    paths = [executable, package_dir, *[p for p in sys_path if p]]
    if prefix != base_prefix:
        paths.append(prefix)
    if entry_script:
        paths.append(entry_script)
    return tuple(dict.fromkeys(os.path.abspath(p) for p in paths))


class HelperProtection(NamedTuple):
    """What init binds read-only and what it hides (path, "dir" | "file"),
    after the [files] limits."""
    read_only: tuple[str, ...] = ()
    hide: tuple[tuple[str, str], ...] = ()
