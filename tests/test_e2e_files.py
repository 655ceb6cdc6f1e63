"""File limits (the policy's [files] table) through real `vpnw guard` runs in the
test world, as root and as an unprivileged user.

Every hard case runs tests/progs/file_probe.py twice: inside the sandbox,
where each attempt must end in one of the errors listed for it (success is a
failure of the test), and outside, as the same user, as the control that
shows the attempt itself works where nothing stops it. A few controls cannot
work as the unprivileged user outside either (writing root's files,
open_by_handle_at); for those the test says so and checks the control only
as root.
"""
from __future__ import annotations

import json
import os
import pwd
import shutil
import sys
import uuid
from pathlib import Path

import pytest

from e2e_support import describe, openat2_ops, run_events
from progs_support import prog_text
from stages.record.check import check_run
from world import DEMO_PACKAGE, DEMO_VALUE, UNPRIVILEGED_USER

pytestmark = pytest.mark.world

PROBE = Path(__file__).resolve().parent / "progs" / "file_probe.py"
NETWORK = '[policy]\ndefault = "deny"\nallow = ["pypi.world"]\n'
REFUSED_WRITE = {"EROFS", "EACCES"}


def chown(path: Path, user: str) -> None:
    pw = pwd.getpwnam(user)
    os.chown(path, pw.pw_uid, pw.pw_gid)


def secret_home(world, user: str) -> tuple[Path, str]:
    """A fresh home for `user` (HOME for both the sandboxed run and the
    control; the world's shared home stays untouched for other tests) with
    ~/.ssh/id_ed25519 and ~/.netrc."""
    home = world.workdir(user)
    home.chmod(0o700)
    ssh = home / ".ssh"
    ssh.mkdir(mode=0o700, exist_ok=True)
    chown(ssh, user)
    key = ssh / "id_ed25519"
    secret = f"SECRET-KEY-{user}"
    key.write_text(secret)
    key.chmod(0o600)
    chown(key, user)
    netrc = home / ".netrc"
    netrc.write_text(f"machine forge login me password NETRC-{user}")
    netrc.chmod(0o600)
    chown(netrc, user)
    return home, secret


def policy(world, files: str, network: str = NETWORK) -> Path:
    return world.file(f"files-{uuid.uuid4().hex[:8]}.toml", f"version = 1\n{network}[files]\n{files}")


def probe(world, user: str, ops: list[dict], *, policy_file: Path | None, cwd: Path, home: Path,
          wrap: list[str] = ()) -> tuple[dict[str, dict], object]:
    """Run the probe in the sandbox (policy_file) or outside (None); results by name."""
    world.file("file_probe.py", PROBE.read_bytes())
    argv = [*wrap, world.python, str(world.tmp / "files" / "file_probe.py"), json.dumps(ops)]
    if policy_file is not None:
        r = world.vpnw(["guard", "--policy", str(policy_file), "--", *argv], user=user, cwd=cwd,
                       env={"HOME": str(home)})
    else:
        r = world.run(argv, user=user, cwd=cwd, env={"HOME": str(home)})
    assert r.returncode == 0, describe(r)
    results = {}
    for line in r.stdout.splitlines():
        out = json.loads(line)
        results[out["op"]] = out
    assert set(results) == {op.get("name", op["op"]) for op in ops}, describe(r)
    return results, r


def assert_outcomes(results: dict[str, dict], expected: dict[str, set | str]) -> None:
    """Each attempt ended in one of its accepted outcomes ("ok" only where listed)."""
    wrong = {name: (results[name]["result"], results[name]["data"]) for name, accepted in expected.items()
             if results[name]["result"] not in ({accepted} if isinstance(accepted, str) else accepted)}
    assert not wrong, f"unexpected outcomes: {wrong}"


def landlock_abi() -> int:
    from stages.helper.landlock import abi_version
    return abi_version()


def files_record(result) -> dict:
    events = run_events(result)
    assert check_run(events) == []           # schema and invariants, files included
    start = events[0]
    assert start["type"] == "run.start"
    return start["fields"]["files"]


# ── reading a denied path, however it is reached ────────────────────────────

def reach_ops(home: Path, work: Path, user: str) -> list[dict]:
    key = f"{home}/.ssh/id_ed25519"
    return [
        {"name": "read_key", "op": "read", "path": key},
        {"name": "list_ssh", "op": "listdir", "path": f"{home}/.ssh"},
        {"name": "read_netrc", "op": "read", "path": f"{home}/.netrc"},
        {"name": "symlink_make", "op": "symlink", "target": key, "path": f"{work}/lnk"},
        {"name": "symlink_read", "op": "read", "path": f"{work}/lnk"},
        {"name": "hardlink_key", "op": "link", "src": key, "path": f"{work}/hard"},
        {"name": "hardlink_netrc", "op": "link", "src": f"{home}/.netrc", "path": f"{work}/hard2"},
        {"name": "dotdot", "op": "read", "path": f"{work}/../{home.name}/.ssh/../.ssh/id_ed25519"},
        {"name": "proc_self_root", "op": "read", "path": f"/proc/self/root{key}"},
        {"name": "proc_1_root", "op": "read", "path": f"/proc/1/root{key}"},
        {"name": "proc_cwd", "op": "proc_cwd", "dir": str(home), "rel": ".ssh/id_ed25519"},
        *openat2_ops(str(home), ".ssh/id_ed25519", key),
    ]


def test_a_denied_path_is_not_there_however_it_is_reached(world, user):
    home, secret = secret_home(world, user)
    work_in, work_out = world.workdir(user), world.workdir(user)
    pol = policy(world, 'deny_read = ["~/.ssh", "~/.netrc", "~/.aws"]\nallow_write = ["."]\n')

    inside, r = probe(world, user, reach_ops(home, work_in, user), home=home, policy_file=pol, cwd=work_in)
    assert_outcomes(inside, {
        "read_key": "ENOENT", "symlink_make": "ok", "symlink_read": "ENOENT",
        "hardlink_key": "ENOENT",
        # the empty file over ~/.netrc is another mount, read-only
        "hardlink_netrc": {"EXDEV", "EROFS", "EPERM", "EACCES"},
        "dotdot": "ENOENT", "proc_self_root": "ENOENT",
        "proc_1_root": {"ENOENT", "EACCES"},        # init is not dumpable
        "proc_cwd": "ENOENT", "openat2_beneath": "ENOENT",
        "openat2_no_xdev": {"EXDEV", "ENOENT"},      # refuses to cross into the mount, never under it
        "openat2_in_root": "ENOENT", "openat2_proc_root": {"ENOENT", "EXDEV", "ELOOP"},
        "list_ssh": "ok", "read_netrc": "ok"})
    assert inside["list_ssh"]["data"] == [] and inside["read_netrc"]["data"] == ""
    assert secret not in r.stdout and "NETRC" not in r.stdout

    record = files_record(r)
    assert record["deny_read"] == [f"{home}/.ssh", f"{home}/.netrc"]
    assert record["deny_read_absent"] == [f"{home}/.aws"]
    assert record["allow_write"] == [str(work_in)]
    assert record["layers"]["deny_read"] == ["mount"]
    assert record["layers"]["allow_write"][0] == "mount"

    # Control: the same attempts outside, as the same user, reach the secret.
    outside, _ = probe(world, user, reach_ops(home, work_out, user), home=home, policy_file=None, cwd=work_out)
    for name in ("read_key", "symlink_read", "dotdot", "proc_self_root", "proc_cwd",
                 "openat2_beneath", "openat2_no_xdev", "openat2_in_root", "openat2_proc_root"):
        assert outside[name] == {"op": name, "result": "ok", "data": secret}, outside[name]
    assert outside["hardlink_key"]["result"] == "ok" and outside["hardlink_netrc"]["result"] == "ok"
    assert outside["list_ssh"]["data"] == ["id_ed25519"]
    assert "NETRC" in outside["read_netrc"]["data"]
    # (proc_1_root has no control: outside, pid 1 is the machine's init, in
    # a mount namespace of its own.)


def test_open_by_handle_at_cannot_reach_a_denied_file(world, user):
    home, secret = secret_home(world, user)
    work = world.workdir(user)
    handle, _ = probe(world, user, [{"op": "name_to_handle", "path": f"{home}/.ssh/id_ed25519"}],
                      home=home, policy_file=None, cwd=work)
    assert handle["name_to_handle"]["result"] == "ok", handle
    op = [{"op": "open_by_handle", "handle": handle["name_to_handle"]["data"], "mount": "/"}]
    pol = policy(world, 'deny_read = ["~/.ssh"]\n')
    inside, r = probe(world, user, op, home=home, policy_file=pol, cwd=work)
    assert_outcomes(inside, {"open_by_handle": {"EPERM", "ESTALE", "EACCES"}})
    assert secret not in r.stdout
    outside, _ = probe(world, user, op, home=home, policy_file=None, cwd=work)
    if user == "root":   # needs CAP_DAC_READ_SEARCH: only root's control can work
        assert outside["open_by_handle"]["data"] == secret, outside
    else:
        assert outside["open_by_handle"]["result"] == "EPERM", outside


# ── writing outside allow_write ─────────────────────────────────────────────

def test_writes_outside_allow_write_are_refused(world, user):
    home, _ = secret_home(world, user)
    work = world.workdir(user)
    tag = uuid.uuid4().hex[:8]
    # Another user's file: vpnwtest's for root; root's (world-writable) for vpnwtest.
    other = world.file(f"other-{tag}", "theirs")
    if user == "root":
        other.chmod(0o600)
        chown(other, UNPRIVILEGED_USER)
    else:
        other.chmod(0o666)
    bashrc = home / ".bashrc"
    bashrc.write_text("# theirs\n")
    chown(bashrc, user)
    cron = f"/etc/cron.d/.vpnw-test-{tag}"        # a dot name: cron would ignore it anyway
    # A file system mounted elsewhere (like /home on its own disk), writable by all.
    other_mount = world.tmp / f"mnt-{tag}"
    other_mount.mkdir()
    world.in_world("mount", "-t", "tmpfs", "-o", "mode=1777,size=1m", "tmpfs", str(other_mount))
    ops = [
        {"name": "cron_d", "op": "create", "path": cron},
        {"name": "root_bashrc", "op": "open_append", "path": "/root/.bashrc"},
        {"name": "other_user", "op": "open_append", "path": str(other)},
        {"name": "own_bashrc", "op": "write", "mode": "a", "path": str(bashrc), "data": "evil\n"},
        {"name": "new_file", "op": "create", "path": f"{home}/new-{tag}"},
        {"name": "new_dir", "op": "mkdir", "path": f"{home}/dir-{tag}"},
        {"name": "tmp", "op": "create", "path": f"/tmp/vpnw-test-{tag}"},
        {"name": "in_work", "op": "write", "path": f"{work}/made-here", "data": "ok"},
        {"name": "dev_null", "op": "write", "path": "/dev/null"},
        {"name": "dev_shm", "op": "write", "path": f"/dev/shm/vpnw-test-{tag}"},
        # a device node root owns: a read-only mount does not stop device
        # writes, Landlock does (opened for append, nothing written)
        {"name": "dev_kmsg", "op": "open_append", "path": "/dev/kmsg"},
        # metadata: Landlock has no right for it, the read-only mount refuses
        {"name": "chmod_bashrc", "op": "chmod", "path": str(bashrc), "mode": 0o777},
        {"name": "truncate_bashrc", "op": "truncate", "path": str(bashrc)},
        {"name": "other_mount", "op": "create", "path": f"{other_mount}/f"},
        {"name": "dev_node_dir", "op": "create", "path": f"/dev/vpnw-test-{tag}"},
    ]
    pol = policy(world, 'allow_write = ["."]\n')
    try:
        inside, _ = probe(world, user, ops, home=home, policy_file=pol, cwd=work)
        outside, _ = probe(world, user, ops[-1:] + ops[-2:-1], home=home, policy_file=None, cwd=work)
        assert outside["other_mount"]["result"] == "ok", outside          # the control
        assert outside["dev_node_dir"]["result"] == ("ok" if user == "root" else "EACCES"), outside
    finally:
        if os.path.exists(f"/dev/vpnw-test-{tag}"):
            os.unlink(f"/dev/vpnw-test-{tag}")
        world.in_world("umount", str(other_mount))
    assert_outcomes(inside, {
        "other_mount": REFUSED_WRITE, "dev_node_dir": REFUSED_WRITE,
        "cron_d": REFUSED_WRITE, "root_bashrc": REFUSED_WRITE, "other_user": REFUSED_WRITE,
        "own_bashrc": REFUSED_WRITE, "new_file": REFUSED_WRITE, "new_dir": REFUSED_WRITE,
        "tmp": REFUSED_WRITE, "in_work": "ok", "dev_null": "ok",
        "chmod_bashrc": REFUSED_WRITE, "truncate_bashrc": REFUSED_WRITE,
        "dev_shm": "ok",    # the sandbox's own /dev/shm, not the host's
        "dev_kmsg": "ENOENT"})     # a [files] run's /dev is minimal (issue 32)
    assert not os.path.exists(cron)
    assert not (home / f"new-{tag}").exists() and not (home / f"dir-{tag}").exists()
    assert not os.path.exists(f"/tmp/vpnw-test-{tag}")
    assert not os.path.exists(f"/dev/shm/vpnw-test-{tag}")
    assert bashrc.read_text() == "# theirs\n" and other.read_text() == "theirs"
    assert (work / "made-here").read_text() == "ok"

    # Control, outside as the same user (a harmless dot name in /etc/cron.d, removed at once).
    try:
        outside, _ = probe(world, user, ops[:-2], home=home, policy_file=None, cwd=work)
    finally:
        for leftover in (cron, f"{home}/new-{tag}", f"/tmp/vpnw-test-{tag}", f"/dev/shm/vpnw-test-{tag}"):
            if os.path.exists(leftover):
                os.unlink(leftover)
        shutil.rmtree(f"{home}/dir-{tag}", ignore_errors=True)
    for name in ("other_user", "own_bashrc", "new_file", "new_dir", "tmp", "dev_shm",
                 "chmod_bashrc", "truncate_bashrc"):
        assert outside[name]["result"] == "ok", outside[name]
    root_only = ("cron_d", "root_bashrc", "dev_kmsg")
    if user == "root":
        assert all(outside[name]["result"] == "ok" for name in root_only), outside
    else:   # the unprivileged user cannot write root's files anywhere
        assert all(outside[name]["result"] == "EACCES" for name in root_only), outside
    # Where the control wrote, the read-only mounts (layer 1) refuse first:
    # EROFS, before Landlock (layer 2, EACCES) is asked. /dev/kmsg is the
    # exception: a read-only mount does not stop a device write.
    # (Root's other_user is refused before either: vpnwtest's 0600 file needs
    # CAP_DAC_OVERRIDE, which root inside no longer has.)
    by_mounts = ["own_bashrc", "new_file", "new_dir", "tmp", "chmod_bashrc", "truncate_bashrc"]
    by_mounts += ["cron_d", "root_bashrc"] if user == "root" else ["other_user"]
    by_mounts += ["other_mount"] + (["dev_node_dir"] if user == "root" else [])
    assert {name: inside[name]["result"] for name in by_mounts} == dict.fromkeys(by_mounts, "EROFS")


def test_rename_or_delete_above_protected_paths(world, user):
    home, _ = secret_home(world, user)
    tag = uuid.uuid4().hex[:8]

    def layout() -> Path:
        work = world.workdir(user)
        for sub, name, text in (("proj", ".env", "SECRET-ENV"), ("keys", "id", "SECRET-K")):
            (work / sub).mkdir()
            (work / sub / name).write_text(text)
        for path in [work / "proj", work / "keys", *work.rglob("*")]:
            chown(path, user)
        return work

    prot = home / f"prot-{tag}"
    prot.mkdir()
    (prot / "f").write_text("protected")
    for p in (prot, prot / "f"):
        chown(p, user)

    def ops(work: Path) -> list[dict]:
        return [
            {"name": "rename_keys", "op": "rename", "src": f"{work}/keys", "path": f"{work}/keys2"},
            {"name": "rmtree_keys", "op": "rmtree", "path": f"{work}/keys"},
            {"name": "unlink_env", "op": "unlink", "path": f"{work}/proj/.env"},
            {"name": "write_env", "op": "write", "path": f"{work}/proj/.env", "data": "x"},
            {"name": "rename_proj", "op": "rename", "src": f"{work}/proj", "path": f"{work}/moved"},
            {"name": "read_env_moved", "op": "read", "path": f"{work}/moved/.env"},
            {"name": "read_env", "op": "read", "path": f"{work}/proj/.env"},
            {"name": "rename_work", "op": "rename", "src": str(work), "path": f"{work}-moved"},
            {"name": "rename_prot", "op": "rename", "src": str(prot), "path": f"{prot}-moved"},
            {"name": "rmtree_prot", "op": "rmtree", "path": str(prot)},
            {"name": "rename_home", "op": "rename", "src": str(home), "path": f"{home}-moved"},
        ]

    work = layout()
    pol = policy(world, 'deny_read = ["./proj/.env", "./keys"]\nallow_write = ["."]\n')
    inside, r = probe(world, user, ops(work), home=home, policy_file=pol, cwd=work)
    busy_or_ro = {"EBUSY", "EROFS", "EACCES", "EPERM"}
    assert_outcomes(inside, {
        "rename_keys": "EBUSY", "rmtree_keys": busy_or_ro, "unlink_env": "EBUSY",
        "write_env": REFUSED_WRITE,
        # a directory above a denied file may move inside the writable tree;
        # the mount moves with it and the file stays hidden
        "rename_proj": {"ok", "EBUSY"},
        "rename_work": busy_or_ro, "rename_prot": REFUSED_WRITE, "rmtree_prot": REFUSED_WRITE,
        "rename_home": busy_or_ro})
    moved = inside["rename_proj"]["result"] == "ok"
    env_read = inside["read_env_moved" if moved else "read_env"]
    assert env_read["result"] == "ok" and env_read["data"] == "", env_read
    assert "SECRET" not in r.stdout
    assert (work / "keys" / "id").read_text() == "SECRET-K"
    assert (work / ("moved" if moved else "proj") / ".env").read_text() == "SECRET-ENV"
    assert (prot / "f").read_text() == "protected" and work.exists()

    # Control: a fresh copy outside, where all of it goes through.
    work2 = layout()
    control = [op for op in ops(work2) if op["name"] not in ("rename_prot", "rmtree_prot", "rename_home")]
    control.append({"name": "rmtree_prot", "op": "rmtree", "path": str(prot)})
    outside, _ = probe(world, user, control, home=home, policy_file=None, cwd=world.tmp)
    for name in ("rename_keys", "unlink_env", "write_env", "rename_proj", "rmtree_prot"):
        assert outside[name]["result"] == "ok", outside[name]
    # renaming the work directory needs write access to its parent (root's world directory)
    assert outside["rename_work"]["result"] == ("ok" if user == "root" else "EACCES"), outside
    shutil.rmtree(f"{work2}-moved", ignore_errors=True)


def test_a_path_that_does_not_exist_yet_never_appears(world, user):
    home, _ = secret_home(world, user)
    work = world.workdir(user)
    tag = uuid.uuid4().hex[:8]
    later = home / f".config-{tag}" / "credentials"
    ops = [{"name": "mkdir_parent", "op": "mkdir", "path": str(later.parent)},
           {"name": "create", "op": "create", "path": str(later)},
           {"name": "symlink_in_work", "op": "symlink", "target": str(later), "path": f"{work}/lnk"},
           {"name": "through_link", "op": "write", "path": f"{work}/lnk", "data": "planted"}]
    pol = policy(world, f'deny_read = ["~/.config-{tag}"]\nallow_write = ["."]\n')
    inside, r = probe(world, user, ops, home=home, policy_file=pol, cwd=work)
    assert_outcomes(inside, {"mkdir_parent": REFUSED_WRITE, "create": {"ENOENT"} | REFUSED_WRITE,
                             "symlink_in_work": "ok", "through_link": {"ENOENT"} | REFUSED_WRITE})
    assert not later.parent.exists()
    assert files_record(r)["deny_read_absent"] == [str(later.parent)]


# ── mounts: the program cannot undo them, as root or as the user ────────────

def test_the_program_cannot_mount_unmount_or_get_mount_rights_back(world, user):
    home, secret = secret_home(world, user)
    work = world.workdir(user)
    for d in ("m", "a", "b"):
        (work / d).mkdir()
        chown(work / d, user)
    ops = [
        {"name": "umount_ssh", "op": "umount", "path": f"{home}/.ssh"},
        {"name": "remount_root_rw", "op": "remount_rw", "path": "/"},
        {"name": "remount_work_rw", "op": "remount_rw", "path": str(work)},
        {"name": "mount_tmpfs", "op": "mount_tmpfs", "path": f"{work}/m"},
        {"name": "bind", "op": "bind", "src": f"{work}/a", "path": f"{work}/b"},
        {"name": "bind_ssh_out", "op": "bind", "src": f"{home}/.ssh", "path": f"{work}/b"},
        {"name": "unshare_mount", "op": "unshare_mount", "path": f"{work}/m"},
        {"name": "read_key", "op": "read", "path": f"{home}/.ssh/id_ed25519"},
    ]
    pol = policy(world, 'deny_read = ["~/.ssh"]\nallow_write = ["."]\n')
    inside, r = probe(world, user, ops, home=home, policy_file=pol, cwd=work)
    assert_outcomes(inside, {
        "umount_ssh": "EPERM", "remount_root_rw": "EPERM", "remount_work_rw": "EPERM",
        "mount_tmpfs": "EPERM", "bind": "EPERM", "bind_ssh_out": "EPERM",
        "unshare_mount": "EPERM",        # the seccomp filter refuses a new user namespace
        "read_key": "ENOENT"})
    assert secret not in r.stdout
    # Control: outside, a new user namespace gives the same user mount rights,
    # and with them the mounts and binds go through.
    outside, _ = probe(world, user, [ops[6]], home=home, policy_file=None, cwd=work)
    assert outside["unshare_mount"] == {"op": "unshare_mount", "result": "ok", "data": []}, outside
    with_caps, _ = probe(world, user, [ops[3], ops[4]], home=home, policy_file=None, cwd=work,
                         wrap=["unshare", "--user", "--map-root-user", "--mount", "--"])
    assert with_caps["mount_tmpfs"]["result"] == "ok" and with_caps["bind"]["result"] == "ok", with_caps


# ── real tools under a file policy ──────────────────────────────────────────

def test_git_commits_and_pip_installs_in_the_writable_tree_and_the_key_is_not_there(world, user):
    home, secret = secret_home(world, user)
    work = world.workdir(user)
    pol = policy(world, 'deny_read = ["~/.ssh", "~/.netrc"]\nallow_write = ["."]\n')
    r = world.vpnw(["guard", "--policy", str(pol), "--", "sh", "-c", prog_text("git_and_pip.sh"), "sh",
                    sys.executable, DEMO_PACKAGE], user=user, cwd=work,
                   timeout=180, env={"HOME": str(home), "PIP_CONFIG_FILE": "/dev/null",
                                     "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert r.returncode == 0, describe(r)
    assert r.stdout.split("\n") == ["one", DEMO_VALUE, "0", ""], describe(r)
    assert secret not in r.stdout + r.stderr and "KEY-READ" not in r.stdout
    assert "No such file or directory" in r.stderr          # cat ~/.ssh/id_ed25519
    assert not (home / ".gitconfig").exists()
    assert (work / "repo" / ".git").is_dir()
    installed = list((work / "venv").rglob("vpnw_demo_pkg/__init__.py"))
    assert installed and DEMO_VALUE in installed[0].read_text()


# ── fail closed ─────────────────────────────────────────────────────────────

def test_a_file_policy_that_cannot_be_enforced_is_exit_122(world, user):
    work = world.workdir(user)
    # /proc/self resolves (outside) to vpnw's own pid, which the sandbox's
    # fresh /proc does not have: the mount cannot be made there.
    pol = policy(world, 'deny_read = ["/proc/self/environ"]\nallow_write = ["."]\n')
    r = world.vpnw(["guard", "--policy", str(pol), "--", "touch", "ran"], user=user, cwd=work)
    assert r.returncode == 122, describe(r)
    assert "[files]" in r.stderr, describe(r)
    assert not (work / "ran").exists()
    events = run_events(r)
    assert events[-1]["type"] == "run.end" and events[-1]["fields"]["exit_code"] == 122
    assert "program.exit" not in [e["type"] for e in events]


def test_bad_file_entries_exit_121_naming_the_line(world, user):
    work = world.workdir(user)
    pol = policy(world, 'allow_write = ["./not-there"]\n')
    r = world.vpnw(["guard", "--policy", str(pol), "--", "true"], user=user, cwd=work)
    assert r.returncode == 121, describe(r)
    assert f"{pol}:6: " in r.stderr and "does not exist" in r.stderr and "fix:" in r.stderr


def test_under_sudo_deny_read_covers_the_sudo_users_home_as_well(world):
    """A root program can read the sudo user's home too, so `~` in deny_read
    means both homes; allow_write's `~` means root's only (never widened)."""
    if not os.path.isdir(pwd.getpwnam(UNPRIVILEGED_USER).pw_dir):
        pytest.skip(f"{UNPRIVILEGED_USER} has no home directory")
    home, _ = secret_home(world, "root")
    work = world.workdir("root")
    pol = policy(world, 'deny_read = ["~/.ssh"]\nallow_write = ["."]\n')
    # The sudo user's home, with a key in it, over the real one.
    user_home = pwd.getpwnam(UNPRIVILEGED_USER).pw_dir
    theirs, secret = secret_home(world, UNPRIVILEGED_USER)
    user_key = os.path.join(user_home, ".ssh", "id_ed25519")
    # Readable by anyone, so that only deny_read can keep it from the program
    # (a root program has no capability over the user's files in the sandbox).
    for path, mode in ((theirs, 0o755), (theirs / ".ssh", 0o755), (theirs / ".ssh" / "id_ed25519", 0o644)):
        path.chmod(mode)
    # For these two runs alone (world.private_binds): never in the world's
    # mount namespace, where other tests use the same home.
    binds = {user_home: str(theirs)}
    # The control: the same run without the table reads it.
    control = world.vpnw(["run", "--", "cat", user_key], user="root", cwd=work, binds=binds,
                         env={"SUDO_USER": UNPRIVILEGED_USER, "HOME": str(home)})
    assert control.returncode == 0 and control.stdout == secret, describe(control)
    r = world.vpnw(["guard", "--policy", str(pol), "--", "sh", "-c", f"cat {user_key}; echo done"],
                   user="root", cwd=work, binds=binds,
                   env={"SUDO_USER": UNPRIVILEGED_USER, "HOME": str(home)})
    assert r.returncode == 0 and r.stdout.strip() == "done", describe(r)
    assert secret not in r.stdout + r.stderr and "No such file" in r.stderr, describe(r)
    record = files_record(r)
    user_ssh = os.path.join(user_home, ".ssh")
    assert f"{home}/.ssh" in record["deny_read"]
    assert user_ssh in record["deny_read"], record
    assert record["allow_write"] == [str(work)]


@pytest.mark.parametrize("mode", ["run", "trace"])
def test_run_and_trace_enforce_the_files_table_too(world, user, mode):
    home, secret = secret_home(world, user)
    work = world.workdir(user)
    pol = policy(world, 'deny_read = ["~/.ssh"]\nallow_write = ["."]\n')
    r = world.vpnw([mode, "--policy", str(pol), "--", "sh", "-c",
                    "cat ~/.ssh/id_ed25519; touch ~/planted; touch made; echo done"],
                   user=user, cwd=work, env={"HOME": str(home)})
    assert r.returncode == 0 and r.stdout.strip() == "done", describe(r)
    assert secret not in r.stdout + r.stderr
    assert "No such file" in r.stderr and "Read-only file system" in r.stderr, describe(r)
    assert not (home / "planted").exists() and (work / "made").exists()
    assert files_record(r)["deny_read"] == [f"{home}/.ssh"]
