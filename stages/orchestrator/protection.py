"""What the program may not change, and the evidence the run checks is
still where it was: computed before the program starts, checked once it and
all its processes are gone (docs/security.md, "The record is out of the
program's reach").

Before: the protection (stages/config/protected.py's inputs gathered from
this run: vpnw's installation and state, the record, the policy, the config,
the --log, what the config names, the work set's repositories) and the
identities (device, inode) of the evidence names and of the pinned paths.
After: each of those names still names what it named, and a protected file
that did not exist at the start and exists now is moved aside."""
from __future__ import annotations

import os
import sys

import stages
from stages.config import protected as pr
from stages.config.lookups import invoker_homes, locate
# work_set's mountinfo reader, not kernel.mounts': that one brings the
# privileges module (and _ctypes) into the orchestrator before the
# recorder is forked (tests/test_recorder_start_cost.py).
from stages.config.work_set import mount_table
from stages.helper.pins import ancestors_to_pin
from stages.orchestrator.run_request import RunRequest
from stages.record.run_file import vpnw_state_dir


def protection(request: RunRequest, record: str) -> pr.Protection:
    """What the program may not change (stages/config/protected.py): vpnw's
    installation and evidence (its state directory, made if missing so the
    program cannot make it and plant runs there; the record, the policy, the
    config, the --log), what the config names, and the files that run code
    outside the sandbox later, among them the work set's repositories'."""
    return pr.protect(protection_inputs(request, record), locate, pr.read_small, pr.list_small_dir)


def protection_inputs(request: RunRequest, record: str) -> pr.Inputs:
    state = vpnw_state_dir()
    keys = os.path.join(state, "keys")
    for made in (os.path.join(state, "runs"), keys):
        try:
            # keys/ too: there is always something to mount the key's empty directory on.
            os.makedirs(made, mode=0o700, exist_ok=True)
        except OSError:
            pass
    cwd = os.getcwd()
    home, other_homes = invoker_homes(request.env)
    named = request.plan.config_files
    files = request.plan.files
    allow_write = tuple(l.path for l in files.allow_write) if files and files.allow_write else ()
    evidence = [state, record, request.plan.policy.source, request.options.config_file,
                request.options.log]
    return pr.Inputs(
        homes=(home, *other_homes), cwd=cwd,
        install=pr.installation(sys.executable, [p for p in sys.path if p != cwd], sys.prefix,
                                sys.base_prefix, os.path.dirname(stages.__file__),
                                sys.argv[0] if os.path.isabs(sys.argv[0]) else None),
        evidence=tuple(p for p in dict.fromkeys(evidence) if p and p != "-"),
        named=tuple(named.named),
        secrets=(*named.secret_files, *_secret_files(request, home)),
        signing_key=(keys,),
        allow_write=allow_write,
        writable_trees=tuple(l.path for l in files.writable() if l.kind == "dir") if files else ())


def _secret_files(request: RunRequest, home: str) -> tuple[str, ...]:
    """The files a secret stands for (the agent's own credential files, a
    file: source): hidden, as the config's secret files are."""
    if request.plan.secrets is None:
        return ()
    # Loaded already when the policy has secrets (run_command's resolve).
    from stages.config.secrets import expand_home
    return tuple(expand_home(p, home) for s in request.plan.secrets.secrets for p in s.hide)


def evidence_names(request: RunRequest, record: str) -> list[str]:
    """The names the next run and `vpnw runs`/`show` look evidence up by.
    For the policy and the config, their directories: the files themselves
    are bound read-only (neither replaced nor removed inside), so only a
    directory above can move them, and that gives the directory another
    inode at its name; `guard --ask` writes the policy file in place (its
    inode stays)."""
    state = vpnw_state_dir()
    names = [state, os.path.join(state, "runs")]
    for named in (request.plan.policy.source, request.options.config_file):
        if named and named != "-":
            names.append(os.path.dirname(os.path.abspath(named)))
    if record != "-":
        names += [record, os.path.dirname(os.path.abspath(record))]
    return list(dict.fromkeys(names))


def pinned_names(protected: pr.Protection) -> list[str]:
    """The protected paths the helper binds read-only and the directories it
    pins above them (stages/helper/pins.py), whose inodes are compared after
    the run. Not the name look-ups: the host replaces /etc/resolv.conf itself.
    Not the evidence files either: `guard --ask` replaces the policy from
    outside during the run (their folders are compared: evidence_names)."""
    paths = [p.path for p in protected.read_only
             if p.path not in pr.NAME_LOOKUP and p.why != "vpnw's evidence"]
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            points = [m.point for m in mount_table(f.read())]
    except OSError:
        points = ["/"]
    return paths + ancestors_to_pin(paths, points)


def identities(names: list[str]) -> dict:
    """{name: (device, inode), or None when it names nothing now}."""
    out = {}
    for name in names:
        try:
            found = os.stat(name)
            out[name] = (found.st_dev, found.st_ino)
        except OSError:
            out[name] = None
    return out


def after_the_program(protected: pr.Protection, names_before: dict, run_id: str, say) -> str | None:
    """Once the program and all its processes are gone (its PID namespace
    ended with it): (1) each evidence name still names the file or directory
    it named at the start: a directory above renamed from inside would let
    the next run load another policy, or `vpnw runs` list forged runs;
    (2) a protected file that did not exist at the start (nothing to bind
    read-only) and exists now is moved aside, never deleted, so the shell or
    git does not run it. A message when either happened, else None."""
    problems = []
    now = identities(list(names_before))
    replaced = {}
    for name, before in names_before.items():
        if before is not None and now[name] != before:
            replaced[name] = (before, now[name])
            problems.append(f"{name} is no longer the file or directory it was when the run "
                            f"started (it, or a directory above it, was moved or replaced during "
                            f"the run)")
    _remember_replaced(replaced, run_id, say)
    for entry in protected.absent:
        if not os.path.lexists(entry.path):
            continue
        if _agents_own_first_settings(entry):
            continue
        aside = f"{entry.path}.vpnw-planted-{run_id}"
        try:
            os.rename(entry.path, aside)
            problems.append(f"{entry.path} ({entry.why}) appeared during the run; "
                            f"vpnw moved it to {aside}: look at it before you use it")
        except OSError as exc:
            problems.append(f"{entry.path} ({entry.why}) appeared during the run and could "
                            f"not be moved aside ({exc.strerror}): look at it before you "
                            f"start a shell or git")
    if not problems:
        return None
    return "WARNING: " + "; ".join(problems)


def _agents_own_first_settings(entry) -> bool:
    """An agent's settings file made during the run that names no command:
    the agent's own first settings (Codex writes ~/.codex/config.toml on its
    first start), left where it is, and read-only from the next run on. One
    that names a command is moved aside like any planted start-up file."""
    if entry.why != pr.AGENT_SETTINGS:
        return False
    read_text = lambda path: pr.read_small(path, limit=1 << 20)   # noqa: E731
    return not pr.new_agent_settings_run_commands(entry.path, read_text)


def _remember_replaced(replaced: dict, run_id: str, say) -> None:
    """What a run found replaced is kept in vpnw's state, so that the next run
    refuses a policy or config it would now load from there
    (stages/orchestrator/replaced.py)."""
    if not replaced:
        return
    # Only a run that found something replaced loads it.
    from stages.orchestrator import replaced as rp
    try:
        rp.remember(vpnw_state_dir(), replaced, run_id)
    except OSError as exc:
        say(f"WARNING: cannot note in {vpnw_state_dir()} what was replaced ({exc.strerror}): "
            f"the next run cannot warn of it")


def say_scan_cut(protected: pr.Protection, say) -> None:
    for tree in protected.scan_cut:
        say(f"{tree} has more than {pr.SCAN_BUDGET} directories in its first {pr.SCAN_DEPTH} levels: "
            f"vpnw did not look for every repository there, and the git hooks and config of "
            f"those it did not find are not pinned read-only")


def say_new_repositories(request: RunRequest, record: str, protected: pr.Protection, say) -> None:
    """A repository the program made in the work set with hooks or config
    that run commands: named in the summary (git runs them when the person
    next works there; nothing stopped the program making it)."""
    inputs = protection_inputs(request, record)
    repositories, _cut = pr.work_set_repositories(inputs, locate, pr.read_small, pr.list_small_dir)
    before = set(protected.repositories)
    for repo in repositories:
        if repo.git_dir in before:
            continue
        active = pr.active_start_up(repo.git_dir, pr.list_small_dir, pr.read_small)
        if active:
            from stages.record.text import printable    # the names are the program's
            say(f"the program made the repository {printable(repo.work_tree)} "
                f"({printable(repo.git_dir)}) with "
                f"{printable(', '.join(active[:6]))}{' ...' if len(active) > 6 else ''}: git runs "
                f"them when you next work there; look at them first")
