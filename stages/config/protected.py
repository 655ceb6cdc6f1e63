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
import stat

from stages.startup.records import NamedTuple  # typing's, without importing typing

# Home-relative: start-up files of shells, sessions, services, git, ssh and
# editors. Each names something that runs, or decides what runs, outside.
AGENT_SETTINGS = "agent settings"
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
    # Agents' settings that name commands (hooks, MCP servers, notify): read
    # even when a preset puts the agent's folder in allow_write, since only
    # naming the very file lifts it. direnv's own start-up runs on every cd.
    AGENT_SETTINGS: (".claude/settings.json", ".claude/settings.local.json",
                       ".codex/config.toml", ".gemini/settings.json",
                       ".config/opencode/opencode.json", ".aider.conf.yml"),
    "direnv start-up": (".config/direnv", ".direnvrc"),
}
# Relative to each writable tree vpnw knows (the start directory, allow_write
# directories): tools and agents run these when the user next works there.
TREE_START_UP = (".vscode", ".idea", ".mcp.json", ".claude/settings.json",
                 ".claude/settings.local.json", ".claude/commands", ".claude/agents",
                 ".envrc", ".codex/config.toml", ".gemini/settings.json")
PROJECT = "project start-up"
# Inside a repository's git directory: what git runs (hooks) or is told to run
# (config: core.fsmonitor, core.hooksPath, core.sshCommand, aliases, filters;
# config.worktree; info/attributes, which picks filters and diff drivers), and
# `commondir`, which says where the rest of it is (a new one would move the
# repository's config to a folder of the program's). See git_start_up().
GIT_DIR_START_UP = ("hooks", "config", "config.worktree", "info/attributes", "commondir")
GIT = "git hooks and configuration"
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
    repositories: tuple[str, ...] = ()   # the git directories found in the work set at the start
    scan_cut: tuple[str, ...] = ()       # directories whose repositories were not all looked for

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


def protect(inputs: Inputs, locate, read_text, list_dir=None) -> Protection:
    """locate(path) -> (realpath, kind); read_text(path) -> str | None (small
    files); list_dir(path) -> [(name, kind)] | None (the repositories below the
    work set's directories; none looked for without it)."""
    wanted: list[tuple[str, str]] = []
    wanted += [(p, "vpnw's installation") for p in inputs.install]
    wanted += [(p, "vpnw's evidence") for p in inputs.evidence]
    wanted += [(p, "a file the config names") for p in inputs.named]
    wanted += [(p, "the machine's name look-ups") for p in NAME_LOOKUP]
    for home in inputs.homes:
        for why, names in HOME_START_UP.items():
            wanted += [(os.path.join(home, n), why) for n in names]
    repositories, scan_cut = work_set_repositories(inputs, locate, read_text, list_dir)
    for tree in dict.fromkeys((inputs.cwd, *inputs.writable_trees)):
        wanted += [(os.path.join(tree, n), PROJECT) for n in TREE_START_UP]
    wanted += git_start_up(repositories, inputs.homes, locate, read_text)
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
    return Protection(_outermost(read_only), tuple(hidden), tuple(absent), tuple(lifted),
                      repositories=tuple(r.git_dir for r in repositories), scan_cut=scan_cut)


def _outermost(entries: list[Protected]) -> tuple[Protected, ...]:
    """One bind per tree: a path inside another read-only one is covered."""
    out: list[Protected] = []
    taken: set[str] = set()      # every path kept; a path is covered when one above is a dir kept
    dirs: set[str] = set()
    for e in sorted(entries, key=lambda e: (len(e.path), e.path)):
        if e.path in taken:
            continue
        here, covered = e.path, False
        while here != "/" and not covered:
            here = os.path.dirname(here)
            covered = here in dirs
        if not covered and not (e.path != "/" and "/" in dirs):
            out.append(e)
            taken.add(e.path)
            if e.kind == "dir":
                dirs.add(e.path)
    return tuple(out)


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
    """The start of a small regular file (a `.git` file, `commondir`, a git
    config), or None. Non-blocking and regular files only: what it reads
    after a run is the program's (a FIFO named `.git/config` would otherwise
    hold vpnw forever)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, limit).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


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


# ---------------------------------------------------------------- the work set's repositories

# How far below each directory of the work set vpnw looks for repositories
# (its own and nested ones: ~/src/a/.git, ~/src/a/vendor/b/.git), and how many
# directories it lists at most (docs/architecture.md, "Pins": the cost).
SCAN_DEPTH = 3
SCAN_BUDGET = 3000
# Folders that hold no repository of the user's, or far too many entries.
SCAN_SKIP = frozenset({".git", "node_modules", "__pycache__", ".venv", "venv", ".tox",
                       ".mypy_cache", ".pytest_cache", ".cache", "site-packages"})
# Trees whose repositories are not looked for below: the file system's root,
# the temporary directories (what is made there is the run's own scratch).
NO_SCAN = ("/", "/tmp", "/var/tmp", "/dev/shm")


class Repository(NamedTuple):
    """One repository git would use in the work set."""
    git_dir: str           # its git directory (realpath)
    work_tree: str         # where its hooks run (a relative core.hooksPath is from here)
    dot_git: str = ""      # the `.git` file naming git_dir, when it is one


def work_set_repositories(inputs: Inputs, locate, read_text, list_dir):
    """(the repositories of the work set, the trees whose scan was cut short):
    the one each directory is in (git looks upward), those below each to
    SCAN_DEPTH, and their submodules' git directories (.git/modules/...)."""
    found: dict[str, Repository] = {}
    cut: list[str] = []
    trees = list(dict.fromkeys((inputs.cwd, *inputs.writable_trees)))
    for tree in trees:
        for repo in _repositories_at(tree, locate, read_text, upward=True):
            found.setdefault(repo.git_dir, repo)
    if list_dir is not None:
        budget = [SCAN_BUDGET]
        for tree in trees:
            if tree in NO_SCAN or any(h == tree or h.startswith(tree.rstrip("/") + "/")
                                      for h in inputs.homes):
                continue    # `/`, a home or above one: too wide to walk (say so: docs/security.md)
            for top in _directories_below(tree, list_dir, budget, cut):
                for repo in _repositories_at(top, locate, read_text, upward=False):
                    found.setdefault(repo.git_dir, repo)
    for repo in list(found.values()):
        for sub in _submodule_git_dirs(repo.git_dir, list_dir, locate):
            found.setdefault(sub, Repository(sub, repo.work_tree))
        for linked in _linked_worktree_dirs(repo.git_dir, list_dir, locate, read_text):
            found.setdefault(linked.git_dir, linked)
    return list(found.values()), tuple(cut)


def _linked_worktree_dirs(git_dir: str, list_dir, locate, read_text) -> list[Repository]:
    """The git directories of the repository's linked worktrees
    (`worktrees/NAME`, made by `git worktree add`): git reads their
    `commondir` and `config.worktree` when the person works in that
    worktree, wherever it is. Its `gitdir` file names the worktree's `.git`."""
    if list_dir is None:
        return []
    out = []
    for name, kind in (list_dir(os.path.join(git_dir, "worktrees")) or [])[:200]:
        here = os.path.join(git_dir, "worktrees", name)
        if kind != "dir":
            continue
        real, found = locate(here)
        back = (read_text(os.path.join(here, "gitdir")) or "").strip()
        if found == "dir":
            out.append(Repository(real, os.path.dirname(back) if back.startswith("/") else real))
    return out


def _directories_below(tree: str, list_dir, budget: list, cut: list):
    """The directories that hold a `.git`, breadth first to SCAN_DEPTH, within
    the shared budget of directories listed."""
    level = [tree]
    for depth in range(SCAN_DEPTH + 1):
        following = []
        for here in level:
            if budget[0] <= 0:
                cut.append(tree)
                return
            budget[0] -= 1
            entries = list_dir(here) or []
            if any(name == ".git" for name, _kind in entries) and here != tree:
                yield here
            if depth < SCAN_DEPTH:
                following += [os.path.join(here, name) for name, kind in entries
                              if kind == "dir" and name not in SCAN_SKIP]
        level = following


def _repositories_at(tree: str, locate, read_text, upward: bool) -> list[Repository]:
    out = []
    here = tree
    while True:
        dot_git = os.path.join(here, ".git")
        real, kind = locate(dot_git)
        if kind == "dir":
            out.append(Repository(real, here))
        elif kind == "file":
            out += [Repository(d, here, real) for d in _linked_git_dirs(here, real, locate, read_text)[:1]]
        if kind != "absent" or here == "/" or not upward:
            return out
        here = os.path.dirname(here)


def _submodule_git_dirs(git_dir: str, list_dir, locate, depth: int = 4) -> list[str]:
    """The git directories under `modules/` (a submodule's name may hold
    slashes; a nested one is under its parent's `modules/` again)."""
    if list_dir is None or depth == 0:
        return []
    out = []
    level = [os.path.join(git_dir, "modules")]
    for _ in range(depth * 2):
        following = []
        for here in level:
            entries = dict(list_dir(here) or [])
            if "HEAD" in entries and entries.get("config") == "file":
                out.append(locate(here)[0])
                following.append(os.path.join(here, "modules"))
            else:
                following += [os.path.join(here, n) for n, k in entries.items() if k == "dir"]
        level = following[:200]
    return out


def git_start_up(repositories: list[Repository], homes: tuple[str, ...], locate,
                 read_text) -> list[tuple[str, str]]:
    """Every place git reads configuration or hooks from for these
    repositories, as (path, why): GIT_DIR_START_UP in each git directory and
    in the common directory its `commondir` names at the start; the `.git`
    file that names a linked git directory; the files the protected configs
    include (include.path, includeIf.*.path); the folder core.hooksPath names
    in any of them (husky's `.husky/_`)."""
    out: list[tuple[str, str]] = []
    user_configs = [os.path.join(h, n) for h in homes for n in (".gitconfig", ".config/git/config")]
    user_configs.append("/etc/gitconfig")
    global_hooks, global_includes = _config_paths(user_configs, homes, read_text)
    out += [(p, GIT) for p in global_includes]
    for repo in repositories:
        git_dirs_ = [repo.git_dir]
        common = (read_text(os.path.join(repo.git_dir, "commondir")) or "").strip()
        if common:
            real, kind = locate(os.path.join(repo.git_dir, common))
            if kind == "dir":
                git_dirs_.append(real)
        if repo.dot_git:
            out.append((repo.dot_git, GIT))
        configs = []
        for d in git_dirs_:
            out += [(os.path.join(d, n), GIT) for n in GIT_DIR_START_UP]
            configs += [os.path.join(d, "config"), os.path.join(d, "config.worktree")]
        hooks, includes = _config_paths(configs, homes, read_text)
        out += [(p, GIT) for p in includes]
        for hooks_path in dict.fromkeys((*hooks, *global_hooks)):
            out.append((os.path.join(repo.work_tree, hooks_path), GIT))
    return out


def _config_paths(configs: list[str], homes, read_text, depth: int = 4):
    """(core.hooksPath values, included files) of these git config files and
    of what they include, `~` expanded, includes resolved from the file."""
    hooks: list[str] = []
    includes: list[str] = []
    pending = [(c, 0) for c in configs]
    while pending:
        config, level = pending.pop(0)
        text = read_text(config)
        if text is None:
            continue
        for section, key, value in git_config_entries(text):
            value = _home_expanded(value, homes)
            if section == "core" and key == "hookspath" and value:
                hooks.append(value)
            elif section in ("include", "includeif") and key == "path" and value:
                included = os.path.join(os.path.dirname(config), value)
                includes.append(included)
                if level < depth:
                    pending.append((included, level + 1))
    return hooks, includes


def _home_expanded(value: str, homes) -> str:
    if (value == "~" or value.startswith("~/")) and homes:
        return homes[0] + value[1:]
    return value


def git_config_entries(text: str) -> list[tuple[str, str, str]]:
    """(section, key, value) of a git config file, section and key lowered,
    a subsection dropped (`[includeIf "gitdir:~/w/"]` -> "includeif"), the
    value unquoted with a trailing comment cut. Lenient: what it cannot read
    it skips (git would refuse such a file anyway)."""
    out = []
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            end = line.find("]")
            if end < 0:
                continue
            head = line[1:end].strip()
            section = head.split(None, 1)[0].split(".", 1)[0].lower() if head else ""
            line = line[end + 1:].strip()
            if not line:
                continue
        key, eq, value = line.partition("=")
        out.append((section, key.strip().lower(), _config_value(value) if eq else "true"))
    return out


def _config_value(value: str) -> str:
    out, quoted = [], False
    i = 0
    while i < len(value):
        c = value[i]
        if c == '"':
            quoted = not quoted
        elif c == "\\" and i + 1 < len(value):
            i += 1
            out.append({"n": "\n", "t": "\t"}.get(value[i], value[i]))
        elif c in "#;" and not quoted:
            break
        else:
            out.append(c)
        i += 1
    return "".join(out).strip()


def list_small_dir(path: str, limit: int = 10000) -> list[tuple[str, str]] | None:
    """The first `limit` entries of a directory as (name, "dir" | "file"),
    symlinks not followed (a link is "file": never walked), or None. Bounded:
    after a run the directories are the program's."""
    out = []
    try:
        with os.scandir(path) as it:
            for e in it:
                out.append((e.name, "dir" if e.is_dir(follow_symlinks=False) else "file"))
                if len(out) >= limit:
                    break
    except OSError:
        return None
    return out


# Keys of a repository's config that make git run a command of their own.
RUNS_COMMANDS = ("core.fsmonitor", "core.hookspath", "core.sshcommand", "core.pager",
                 "core.editor", "core.askpass", "credential.helper")


def active_start_up(git_dir: str, list_dir, read_text) -> list[str]:
    """What in a git directory runs without the person's command: hooks that
    are not git's samples, and config keys that name a command."""
    hooks = sorted(name for name, kind in (list_dir(os.path.join(git_dir, "hooks")) or [])
                   if kind == "file" and not name.endswith(".sample"))
    keys = sorted({f"{s}.{k}" for s, k, _v in git_config_entries(
        read_text(os.path.join(git_dir, "config")) or "") if f"{s}.{k}" in RUNS_COMMANDS})
    return [f"hooks/{h}" for h in hooks] + keys


# ---------------------------------------------------------------- an agent's new settings

# Keys of an agent's settings that make it run a command, or start one with
# an environment of the file's choosing (Claude Code's hooks, statusLine,
# apiKeyHelper, env, MCP servers; Codex's notify, mcp_servers,
# shell_environment_policy; the like), at any depth (profiles nest them).
COMMAND_FIELDS = frozenset({
    "hooks", "command", "commands", "statusLine", "apiKeyHelper", "awsAuthRefresh",
    "awsCredentialExport", "otelHeadersHelper", "env", "mcpServers", "mcp_servers",
    "notify", "shell_environment_policy", "shell", "args", "hook"})


def new_agent_settings_run_commands(path: str, read_text) -> bool:
    """Whether an agent's settings file that was not there at the start
    names a command (an agent writes its own first settings: Codex makes
    ~/.codex/config.toml on its first start). What cannot be read as JSON
    or TOML, or is not a regular file, counts as naming one."""
    text = read_text(path)
    if text is None:
        return True
    try:
        if path.endswith(".json"):
            import json      # json and tomllib only for a settings file made during the run
            tree = json.loads(text)
        elif path.endswith(".toml"):
            import tomllib   # (the same: a settings file made during the run)
            tree = tomllib.loads(text)
        else:
            return True
    except ValueError:
        return True
    pending = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            if any(str(k) in COMMAND_FIELDS for k in node):
                return True
            pending += node.values()
        elif isinstance(node, list):
            pending += node
    return False
