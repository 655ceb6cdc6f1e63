"""`vpnw doctor`: what this machine supports, and what to change when it doesn't.

Each check reads a file or tries one thing in a forked child; none changes
the machine. `run_checks()` returns the list; `doctor_command` prints it.

It lives in the command layer, beside cli.py and the orchestrator, because it
asks more than one stage: the helper's pieces (namespaces, seccomp, mounts,
Landlock) and the broker's path check.
"""
from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import tomllib
from typing import NamedTuple

import click

from stages.config.client_env import apply, settings_for_doctor
from stages.config.paths import ConfigError, load_config, with_secret
from stages.helper import capture, netlink
from stages.helper.landlock import abi_version
from stages.helper.seccomp_rules import build_filter
from stages.helper.supervisor.launch import answered_by, missing
from stages.kernel import privileges as priv
from stages.kernel.mounts import mount_fresh_devpts, read_only
from stages.orchestrator import apparmor
from stages.orchestrator.held import kernel_can, remove
from stages.record import signing
from stages.record.events import state_dir
from stages.record.run_file import vpnw_state_dir
from stages.wire import handoff
from stages.wire.exits import ExitCode


class Check(NamedTuple):
    name: str
    status: str  # 'ok' | 'warn' | 'fail'
    detail: str
    fix: str = ""


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def check_kernel() -> Check:
    release = os.uname().release
    try:
        major, minor = (int(x) for x in release.split(".")[:2])
    except ValueError:
        return Check("kernel", "warn", f"cannot read the version in {release!r}")
    if (major, minor) < (5, 4):
        return Check("kernel", "fail", f"Linux {release}; vpnw needs 5.4 or newer",
                     "upgrade the kernel")
    return Check("kernel", "ok", f"Linux {release}")


def check_userns_sysctls() -> list[Check]:
    out = []
    maxns = _read("/proc/sys/user/max_user_namespaces")
    if maxns is not None and maxns.isdigit() and int(maxns) == 0:
        out.append(Check("max_user_namespaces", "fail", "user.max_user_namespaces = 0",
                         "sysctl -w user.max_user_namespaces=10000"))
    else:
        out.append(Check("max_user_namespaces", "ok", f"user.max_user_namespaces = {maxns}"))
    clone = _read("/proc/sys/kernel/unprivileged_userns_clone")
    if clone is not None:
        if clone == "0" and os.getuid() != 0:
            out.append(Check("unprivileged_userns_clone", "fail", "kernel.unprivileged_userns_clone = 0",
                             "sysctl -w kernel.unprivileged_userns_clone=1"))
        else:
            out.append(Check("unprivileged_userns_clone", "ok", f"kernel.unprivileged_userns_clone = {clone}"))
    apparmor = check_apparmor_userns()
    if apparmor is not None:
        out.append(apparmor)
    return out


def check_apparmor_userns() -> Check | None:
    """Ubuntu 23.10 and later: is there a profile that lets vpnw make user
    namespaces (stages/orchestrator/apparmor.py)? None where nothing is restricted."""
    label = next((text for text in map(_read, apparmor.LABEL_FILES) if text), None)
    found = apparmor.verdict(_read(apparmor.SYSCTL), label, _user_name())
    return Check("apparmor_userns", *found) if found else None


def _user_name() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def launcher_path() -> str:
    """vpnw's launcher as installed (the venv's bin/vpnw, symlinks resolved):
    the file AppArmor attaches the profile to."""
    return os.path.realpath(os.path.join(os.path.dirname(sys.executable), "vpnw"))


def _try_in_child(fn) -> str | None:
    """Run fn in a forked child; None if it worked, else its error text."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            fn()
            os._exit(0)
        except BaseException as e:  # report anything, never return into the parent's code
            os.write(w, str(e).encode()[:500])
            os._exit(1)
    os.close(w)
    msg = b""
    while chunk := os.read(r, 512):
        msg += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) == 0:
        return None
    return msg.decode(errors="replace") or f"child ended with status {status}"


def check_namespaces() -> Check:

    def attempt():
        uid, gid = os.getuid(), os.getgid()
        priv.unshare(priv.SANDBOX_NAMESPACES)
        priv.write_id_maps(uid, gid)

    err = _try_in_child(attempt)
    if err is None:
        return Check("namespaces", "ok", "can create user+net+pid+ipc+mnt namespaces")
    return Check("namespaces", "fail", f"cannot create user+net+pid+ipc+mnt namespaces: {err}",
                 "enable unprivileged user namespaces (see the checks above)")


def check_devpts() -> Check:
    """Every sandbox mounts a devpts of its own (the user's terminals are not
    there to open by name; the program's pty is made in it)."""

    def attempt():
        uid, gid = os.getuid(), os.getgid()
        priv.unshare(priv.CLONE_NEWUSER | priv.CLONE_NEWNS)
        priv.write_id_maps(uid, gid)
        priv.mount(None, "/", None, priv.MS_REC | priv.MS_PRIVATE)
        mount_fresh_devpts()
        os.close(os.open("/dev/pts/ptmx", os.O_RDWR | os.O_NOCTTY))

    err = _try_in_child(attempt)
    if err is None:
        return Check("devpts", "ok", "the sandbox can have a devpts of its own (the program's terminal)")
    return Check("devpts", "fail", f"cannot mount a devpts in a user namespace: {err}; "
                 "every run exits 122 here", "use Linux 4.7 or newer with CONFIG_DEVPTS_FS")


def check_capture() -> Check:
    """--capture (docs/architecture.md "Capture"): the local default routes
    and vpnw's nftables table, made and read back in a scratch user+net
    namespace exactly as a run does; optional, so a warning when it fails."""

    def attempt():
        uid, gid = os.getuid(), os.getgid()
        priv.unshare(priv.CLONE_NEWUSER | priv.CLONE_NEWNET)
        priv.write_id_maps(uid, gid)
        netlink.bring_up("lo")
        capture.install(handoff.CAPTURE_DOORS["capture"], handoff.DNS_PORT)

    err = _try_in_child(attempt)
    if err is None:
        return Check("capture", "ok", "--capture works: local default routes and vpnw's nftables "
                     "table in the sandbox, read back exactly")
    return Check("capture", "warn", f"--capture cannot work here: {err}; a run that asks for it "
                 "exits 122", "install Debian's nftables (scripts/setup does)")


def check_seccomp() -> list[Check]:
    out = []
    actions = _read("/proc/sys/kernel/seccomp/actions_avail")
    if actions is None:
        out.append(Check("seccomp", "fail", "the kernel has no seccomp filter support",
                         "use a kernel built with CONFIG_SECCOMP_FILTER"))
    elif "errno" not in actions.split():
        out.append(Check("seccomp", "fail", f"seccomp actions lack errno: {actions}",
                         "use a newer kernel"))
    else:
        out.append(Check("seccomp", "ok", f"actions: {actions}"))
    try:
        build_filter(False)
        out.append(Check("libseccomp", "ok", "libseccomp loads through pyseccomp"))
    except Exception as e:
        out.append(Check("libseccomp", "fail", f"cannot use libseccomp: {e}",
                         "apt-get install libseccomp2 (and pip install pyseccomp)"))
    return out


def check_file_limits() -> list[Check]:
    """The two layers of a policy's [files] table: read-only and empty mounts in
    the sandbox's mount namespace (needed), Landlock for writes (when present)."""

    def attempt():
        uid, gid = os.getuid(), os.getgid()
        priv.unshare(priv.CLONE_NEWUSER | priv.CLONE_NEWNS)
        priv.write_id_maps(uid, gid)
        priv.mount(None, "/", None, priv.MS_REC | priv.MS_PRIVATE)
        priv.mount("tmpfs", "/tmp", "tmpfs", 1 | priv.MS_NOSUID | priv.MS_NODEV, "size=4k")
        priv.mount("/tmp", "/tmp", None, 4096 | priv.MS_REC)    # a recursive bind
        read_only("/")                                          # / remounted read-only

    err = _try_in_child(attempt)
    out = []
    if err is None:
        out.append(Check("files_mounts", "ok", "[files] limits: read-only binds and empty mounts work"))
    else:
        out.append(Check("files_mounts", "fail", f"[files] limits cannot be mounted: {err}; "
                         "a policy with a [files] table exits 122 here (policies without one still work)",
                         "enable unprivileged user and mount namespaces"))
    abi = abi_version()
    if abi:
        out.append(Check("landlock", "ok", f"Landlock ABI {abi}: a second layer for allow_write"))
    else:
        out.append(Check("landlock", "warn", "no Landlock (ENOSYS or not in lsm=): allow_write is "
                         "enforced by read-only mounts alone",
                         "boot with landlock in the lsm= list (Linux 5.13 or newer)"))
    return out


def check_held_layer() -> Check:
    """Which one this machine gets for writes outside a run's work set: the
    held layer (an overlay in the run's user namespace, upper directory in
    vpnw's state) or read-only (docs/security.md, "The work set and the held
    layer"). Tried on a scratch directory in the state directory itself, as
    a run mounts it."""
    why = kernel_can()
    if why:
        return Check("held_layer", "warn", f"writes outside a run's work set fail read-only (EROFS), "
                     f"not held: {why}", "run vpnw on Linux 5.11 or newer")
    state = vpnw_state_dir()
    where = state
    while not os.path.isdir(where) and where != "/":
        where = os.path.dirname(where)     # nothing is made for the check: the nearest that exists
    try:
        scratch = tempfile.mkdtemp(prefix=".vpnw-doctor-held-", dir=where)
    except OSError as e:
        return Check("held_layer", "warn", f"cannot try the held layer: {where}: {e.strerror}; "
                     "runs then keep writes outside their work set read-only",
                     "make vpnw's state directory writable")
    try:
        for part in ("lower", "upper", "work", "mnt"):
            os.mkdir(os.path.join(scratch, part))

        def attempt():
            uid, gid = os.getuid(), os.getgid()
            priv.unshare(priv.CLONE_NEWUSER | priv.CLONE_NEWNS)
            priv.write_id_maps(uid, gid)
            priv.mount(None, "/", None, priv.MS_REC | priv.MS_PRIVATE)
            priv.mount("overlay", f"{scratch}/mnt", "overlay", 0,
                       f"lowerdir={scratch}/lower,upperdir={scratch}/upper,workdir={scratch}/work,userxattr")
            with open(f"{scratch}/mnt/held", "w") as f:
                f.write("x")
            if os.path.exists(f"{scratch}/lower/held"):
                raise OSError("the write reached the lower directory")

        err = _try_in_child(attempt)
    finally:
        remove(scratch)     # overlay's work/work is left with mode 0
    if err is None:
        return Check("held_layer", "ok", "writes outside a run's work set are held (an overlay in "
                     "the run's user namespace; `vpnw changes RUN` lists them)")
    return Check("held_layer", "warn", f"writes outside a run's work set fail read-only (EROFS), not "
                 f"held: an overlay cannot be mounted in a user namespace here ({err})",
                 "Linux 5.11 or newer with overlayfs, and vpnw's state on a file system that "
                 "overlay takes as an upper directory (ext4, xfs, btrfs, tmpfs; not overlay itself)")


def check_io_uring() -> Check:
    value = _read("/proc/sys/kernel/io_uring_disabled")
    detail = {None: "no io_uring_disabled sysctl", "0": "io_uring enabled for all",
              "1": "io_uring limited to a group", "2": "io_uring disabled"}.get(value, value)
    return Check("io_uring", "ok", f"{detail}; the sandbox's filter refuses it either way")


DEFAULT_MARK = "(the config's default)"


def check_paths(config_file: str) -> list[Check]:
    """Each configured path, checked the way a run checks it before the program starts."""
    import asyncio  # only --config dials a path: asyncio and the broker's dialers stay off the rest
    from stages.broker.dial import PathDownError  # only --config dials a path (as above)
    from stages.broker.dialers import dialer_for  # only --config dials a path (as above)
    try:
        config = load_config(config_file)
    except (ConfigError, OSError) as e:
        return [Check("config", "fail", str(e), "fix the config file")]
    checks = []
    for name, path in sorted(config.paths.items()):
        # The config's default is what every run through it without --via takes:
        # down, it is a failure (doctor exits 123, as those runs would).
        label, bad = (f"path {name} {DEFAULT_MARK}", "fail") if name == config.default else (f"path {name}", "warn")
        try:
            path = with_secret(path)
        except ConfigError as e:
            checks.append(Check(label, bad, str(e),
                                "runs via this path need its password; others do not"))
            continue
        dialer = dialer_for(path)
        try:
            asyncio.run(dialer.check())
            checks.append(Check(label, "ok", f"{path.describe()} answers"))
        except PathDownError as e:
            runs = ("every run through this config without --via exits 123" if bad == "fail"
                    else "runs via it exit 123")
            checks.append(Check(label, bad, str(e), f"start the exit or fix its url/credentials; {runs}"))
        finally:
            if hasattr(dialer, "close"):
                dialer.close()      # a WireGuard path's tunnel ends with the check
    return checks


def config_names_wireguard(config_file: str) -> bool:
    """Whether the paths file has a [paths.X] of type "wireguard", even one
    that is wrong in other ways (check_paths says what is)."""
    try:
        with open(config_file, "rb") as f:
            paths = tomllib.load(f).get("paths", {})
    except (OSError, tomllib.TOMLDecodeError):
        return False
    return isinstance(paths, dict) and any(
        isinstance(table, dict) and table.get("type") == "wireguard" for table in paths.values())


def check_wireguard_support(needed: bool = False) -> list[Check]:
    """What a WireGuard path needs here: wireguard-go, and /dev/net/tun
    usable by this user (the tun is made in a namespace of vpnw's own, but
    opening the device is checked against the machine's file mode). Always
    checked: a lack is a failure when the paths file given names a WireGuard
    path (`needed`), a warning otherwise (nothing else needs them)."""
    bad = "fail" if needed else "warn"
    checks = []
    if shutil.which("wireguard-go"):
        checks.append(Check("wireguard-go", "ok", f"{shutil.which('wireguard-go')} is installed"))
    else:
        checks.append(Check("wireguard-go", bad, "wireguard-go is not installed: WireGuard paths "
                            "exit 123", "apt-get install wireguard-go (no kernel module needed)"))
    try:
        mode = stat.S_IMODE(os.stat("/dev/net/tun").st_mode)
    except OSError:
        checks.append(Check("tun", bad, "/dev/net/tun does not exist: WireGuard paths exit 123",
                            "load the tun module (modprobe tun) or give the container /dev/net/tun"))
        return checks
    if os.access("/dev/net/tun", os.R_OK | os.W_OK):
        checks.append(Check("tun", "ok", f"/dev/net/tun (mode {mode:04o}) is usable by this user"))
    else:
        checks.append(Check("tun", bad, f"/dev/net/tun is mode {mode:04o}, not usable by this user: "
                            "WireGuard paths exit 123. Opening it gives no power over the machine's "
                            "network (a tun device is created in vpnw's own namespace); Debian's udev "
                            "makes it 0666, some machines and containers keep it 0600",
                            "as root: chmod 0666 /dev/net/tun (and a udev rule "
                            'KERNEL=="tun", MODE="0666" to keep it)'))
    return checks


def check_state_dir() -> Check:
    runs = state_dir()
    probe = runs
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if os.access(probe, os.W_OK | os.X_OK):
        return Check("state_dir", "ok", f"{runs} is writable")
    return Check("state_dir", "fail", f"cannot write under {probe}",
                 "set XDG_STATE_HOME to a writable directory or use --record FILE")


def check_signing() -> Check:
    """The signed end of each run (docs/record.md, "The signed end"): libsodium loads."""
    try:
        signing.signing_library()
    except signing.SigningUnavailable as exc:
        return Check("signing", "fail", f"{exc.strerror or exc}; a run recorded to a file stops "
                     "before the program (125)", "apt-get install libsodium23")
    return Check("signing", "ok", "libsodium loads: each run recorded to a file is signed "
                 "(`vpnw key` prints the public key)")


def program_variables() -> dict[str, str]:
    """What vpnw puts in the program's environment when the user set nothing."""

    return dict(settings_for_doctor(sys.executable))


def check_program_env() -> Check:

    names = " ".join(program_variables())
    detail = (f"vpnw sets {names} for the program "
              "(a client's own setting that you set is kept, and the record says so)")
    _, kept = apply(dict(os.environ), python=sys.executable)
    if not kept:
        return Check("program_env", "ok", detail)
    return Check("program_env", "warn",
                 f"{detail}; here your own {', '.join(kept)} would be kept, so that client "
                 f"does not go through the doors unless your setting does",
                 "see \"Clients\" in the README for what to add (e.g. ProxyCommand=vpnw-ssh-proxy %h %p)")


def check_unix_supervisor() -> Check:
    """The program's own Unix sockets need the supervisor (docs/security.md,
    "Unix sockets by origin"); without it every Unix socket stays refused."""
    actions = (_read("/proc/sys/kernel/seccomp/actions_avail") or "").split()
    why = None if "user_notif" in actions else "seccomp has no user notification (user_notif)"
    why = why or missing()
    if why:
        return Check("unix_sockets", "warn",
                     f"{why}: the program's own Unix sockets are refused too (as every other "
                     "Unix socket is), so programs that talk to their own servers over them fail",
                     "use Linux 5.9 or newer (pidfd_getfd, seccomp user notification) with "
                     "libseccomp 2.5 or newer")
    return Check("unix_sockets", "ok", "the program's own Unix sockets work; others are refused "
                 "unless the policy's [unix] allow names them; a TCP connect's \"continue\" "
                 f"is answered by the {answered_by()} path")


# Node honours NODE_USE_ENV_PROXY (which vpnw sets) from these versions on.
NODE_ENV_PROXY_SINCE = ((22, 21), (24, 0))


def node_honours_env_proxy(version: str) -> bool | None:
    """Whether `node --version`'s answer (v22.21.0) is a Node that reads the
    proxy variables itself; None when it is not a version."""
    found = re.match(r"v?(\d+)\.(\d+)", version.strip())
    if found is None:
        return None
    have = (int(found.group(1)), int(found.group(2)))
    return any(have >= since and (since[0] == 24 or have[0] == since[0])
               for since in NODE_ENV_PROXY_SINCE)


def check_node() -> Check:
    """A Node older than 22.21 ignores NODE_USE_ENV_PROXY: its fetch() and
    https requests do not go to the doors unless the program sets an agent."""
    node = shutil.which("node") or shutil.which("nodejs")
    if node is None:
        return Check("node", "ok", "no Node.js on PATH")
    try:
        version = subprocess.run([node, "--version"], capture_output=True, text=True,
                                 timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        return Check("node", "warn", f"{node} --version failed: {e}")
    honours = node_honours_env_proxy(version)
    if honours:
        return Check("node", "ok", f"{node} is Node {version}, which honours NODE_USE_ENV_PROXY")
    return Check("node", "warn",
                 f"{node} is Node {version or '(no version)'}, older than 22.21: it ignores "
                 "NODE_USE_ENV_PROXY, so a Node program's fetch() and https requests cannot go "
                 "out unless the program reads HTTPS_PROXY itself (npm does, from the "
                 "npm_config_ variables vpnw sets)", "use Node 22.21 or newer")


def run_checks(config_file: str | None = None) -> list[Check]:
    checks = [check_kernel(), *check_userns_sysctls(), check_namespaces(), check_devpts(),
              check_capture(),
              *check_seccomp(), check_unix_supervisor(),
              check_io_uring(), *check_file_limits(), check_held_layer(), check_state_dir(), check_signing(), check_program_env(),
              check_node(),
              *check_wireguard_support(needed=bool(config_file) and config_names_wireguard(config_file))]
    if config_file:
        checks += check_paths(config_file)
    return checks


def render(check: Check, columns: int | None) -> str:
    """One check as text; wrapped to `columns` (a terminal's width) when given,
    each further row indented under the name, words and paths never cut."""
    text = f"{check.status:<5} {check.name}  {check.detail}" + (f"  (fix: {check.fix})" if check.fix else "")
    if not columns:
        return text
    return textwrap.fill(text, width=max(columns, 40), subsequent_indent=" " * 6,
                         break_long_words=False, break_on_hyphens=False)


def exit_code(checks: list[Check]) -> int:
    """0: guard can work here; 1: it cannot. With --config, what a run through
    the config would meet: a config that does not load is 121, its default
    path down is 123 (the run's own codes, docs/architecture.md)."""
    if not guard_can_work(checks):
        return 1
    if any(c.name == "config" and c.status == "fail" for c in checks):
        return ExitCode.USAGE
    if any(c.name.endswith(DEFAULT_MARK) and c.status == "fail" for c in checks):
        return ExitCode.PATH_DOWN
    return 0


def guard_can_work(checks: list[Check]) -> bool:
    return all(c.status != "fail" for c in checks if c.name in
               ("kernel", "max_user_namespaces", "unprivileged_userns_clone", "apparmor_userns",
                "namespaces", "seccomp", "libseccomp"))


def terminal_columns() -> int | None:
    """The width of the terminal stdout is, or None (a pipe, a file: one line per check)."""
    try:
        return os.get_terminal_size(1).columns if os.isatty(1) else None
    except OSError:
        return None


@click.command("doctor")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per check.")
@click.option("--config", "config_file", type=click.Path(dir_okay=False),
              help="Also check that each path in this paths file answers.")
@click.option("--apparmor-profile", "apparmor_profile", is_flag=True,
              help="Print the AppArmor profile that lets this vpnw make user namespaces where "
                   "AppArmor restricts them (Ubuntu 23.10 and later), for root to install; check nothing.")
def doctor_command(as_json: bool, config_file: str | None, apparmor_profile: bool = False) -> None:
    """Say what this machine supports; exit 0 if guard can work here, 1 if not.

    With --config: 121 if the paths file does not load, 123 if its default
    path is down (every run through it would exit 123)."""
    if apparmor_profile:
        launcher = launcher_path()
        if not os.path.isfile(launcher):
            raise click.UsageError(f"no vpnw launcher at {launcher}: run the installed vpnw "
                                   "(its venv's bin/vpnw)")
        try:
            click.echo(apparmor.profile_text(launcher), nl=False)
        except apparmor.ProfileProblem as exc:
            raise click.UsageError(str(exc)) from None
        return
    checks = run_checks(config_file)
    variables = program_variables()
    columns = terminal_columns()
    for c in checks:
        if as_json:
            extra = {"variables": variables} if c.name == "program_env" else {}
            click.echo(json.dumps({**c._asdict(), **extra}))
        else:
            click.echo(render(c, columns))
            if c.name == "program_env":
                # Values whole, never wrapped: they are there to be copied.
                for name, value in variables.items():
                    click.echo(f"        {name}={value}")
    raise SystemExit(exit_code(checks))
