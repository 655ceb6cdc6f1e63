"""git over ssh through vpnw with no configuration, in the test world, as root
and as an unprivileged user.

Debian's sshd runs in the internet namespace on git.world:22 with a bare
repository. Inside vpnw, git runs the GIT_SSH_COMMAND vpnw set: ssh with the
shipped relay (stages/inside/ssh_proxy.py) as its ProxyCommand, which asks the SOCKS5
door for git.world:22 with the name unresolved. ssh checks the host key
against the known_hosts entry for git.world; the broker decides git.world:22
with the policy and records it like any other connection.
"""
from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from ci_support import cannot as _cannot
from e2e_support import describe, opened, run_events
from world import DEFAULT_NAMES, UNPRIVILEGED_USER, _check

# The README's client table: git over ssh, ssh and scp.
pytestmark = [pytest.mark.world, pytest.mark.readme_table]
GIT_HOST = "git.world"
SERVER_USER = UNPRIVILEGED_USER   # the account sshd lets in (git@ on a real forge)




class SshServer:
    """sshd -D in the internet namespace, in a mount namespace of its own
    (a tmpfs /run for its privilege-separation directory, and a copy of
    /etc/shadow in which the server account is not locked: with UsePAM no,
    sshd refuses a locked account even for a key), so the host is untouched."""

    def __init__(self, world):
        self.world = world
        # A fresh directory each time: pytest-xdist may set this module up twice on one worker.
        self.dir = Path(tempfile.mkdtemp(prefix="sshd-", dir=world.tmp))
        self.dir.chmod(0o755)
        self.log = self.dir / "sshd.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> "SshServer":
        d = self.dir
        _check(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", GIT_HOST, "-f", str(d / "host_key")])
        self.host_key = " ".join((d / "host_key.pub").read_text().split()[:2])
        shadow = "".join(f"{SERVER_USER}:*:" + line.split(":", 2)[2] if line.startswith(f"{SERVER_USER}:")
                         else line for line in open("/etc/shadow"))
        (d / "shadow").write_text(shadow)
        (d / "shadow").chmod(0o600)
        self.keys = d / "authorized_keys"
        self.keys.write_text("")
        self.keys.chmod(0o644)
        (d / "sshd_config").write_text(
            f"Port 22\nListenAddress {DEFAULT_NAMES[GIT_HOST][0]}\nHostKey {d}/host_key\n"
            f"AuthorizedKeysFile {self.keys}\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nPubkeyAuthentication yes\nUsePAM no\nStrictModes no\n"
            f"PidFile none\nAllowUsers {SERVER_USER}\nPermitRootLogin no\nLogLevel VERBOSE\n"
            "Subsystem sftp internal-sftp\n")
        # The repository the clients clone and push to, owned by the server account.
        self.repo = d / "repo.git"
        _check(["git", "clone", "-q", "--bare", str(self.world.docroot / "repo.git"), str(self.repo)])
        pw = pwd.getpwnam(SERVER_USER)
        for path in [self.repo, *self.repo.rglob("*")]:
            os.chown(path, pw.pw_uid, pw.pw_gid)
        script = (f"mount -t tmpfs -o mode=755 tmpfs /run && mkdir -m 755 /run/sshd && "
                  f"mount --bind {d}/shadow /etc/shadow && "
                  f"exec /usr/sbin/sshd -D -e -f {d}/sshd_config")
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                ["nsenter", "-t", str(self.world.internet_pid), "-n", "--",
                 "unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        # sshd -e says when it listens; wait for that line (or its death).
        for _ in range(2000):
            if "Server listening" in self.log.read_text(errors="replace"):
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.005)
        raise RuntimeError(f"sshd did not start: {self.log.read_text(errors='replace')}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait(timeout=10)

    def client(self, user: str, host_key: str | None = None) -> None:
        """Give `user` an ssh key the server accepts and a known_hosts entry
        for git.world (the real host key, or `host_key`), in ~/.ssh as ssh
        expects them: no -i, no options."""
        home = self.home(user)
        ssh = home / ".ssh"
        pw = pwd.getpwnam(user)
        ssh.mkdir(mode=0o700, exist_ok=True)
        key, pub = ssh / "id_ed25519", ssh / "id_ed25519.pub"
        # The home is this module's own (self.home): no other test's stand-in
        # key can be there, only ours from an earlier test.
        if not key.exists():
            _check(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", user, "-f", str(key)])
        if pub.read_text() not in self.keys.read_text():
            with open(self.keys, "a") as keys:
                keys.write(pub.read_text())
        (ssh / "known_hosts").write_text(f"{GIT_HOST} {host_key or self.host_key}\n")
        for path in [ssh, *ssh.iterdir()]:
            os.chown(path, pw.pw_uid, pw.pw_gid)

    def home(self, user: str) -> Path:
        """This module's own home for `user` (other tests put their own files
        in the world's shared homes, a fake ~/.ssh/id_ed25519 among them)."""
        home = self.dir / f"home-{user}"
        if not home.exists():
            home.mkdir(mode=0o700)
            pw = pwd.getpwnam(user)
            os.chown(home, pw.pw_uid, pw.pw_gid)
        return home

    def vpnw(self, args: list, *, user: str, **kw):
        """world.vpnw with HOME set to this module's home for `user`, and
        its home in place of the passwd entry's (passwd_homes)."""
        return self.run([str(self.world.vpnw_path), *args], user=user, **kw)

    def run(self, cmd: list, *, user: str, **kw):
        return self.world.run(cmd, user=user, env={"HOME": str(self.home(user)), **kw.pop("env", {})},
                              binds=self.passwd_homes(), **kw)

    def passwd_homes(self) -> dict[str, str]:
        """ssh reads ~/.ssh from the passwd entry's home, not $HOME: for each
        command of this module alone (a mount namespace of its own, see
        world.private_binds), this module's home for each user over it.
        Never in the world's namespace, where it outlived the module or met
        other tests' mounts on the same paths under pytest-xdist."""
        binds = {}
        for user in ("root", UNPRIVILEGED_USER):
            try:
                home = pwd.getpwnam(user).pw_dir
            except KeyError:
                continue
            if os.path.isdir(home):
                binds[home] = str(self.home(user))
        return binds

    def branches(self) -> str:
        return _check(["git", "--git-dir", str(self.repo), "for-each-ref", "--format=%(refname)"]).stdout


@pytest.fixture(scope="module")
def sshd(world):
    if not os.path.exists("/usr/sbin/sshd") or shutil.which("ssh") is None:
        _cannot("the git-over-ssh tests need Debian's openssh-server and openssh-client "
                "(scripts/setup installs them)")
    server = SshServer(world)
    try:
        yield server.start()
    finally:
        server.stop()


def url(server: SshServer) -> str:
    return f"{SERVER_USER}@{GIT_HOST}:{server.repo}"


def ssh_opened(events) -> list:
    return [o for o in opened(events) if o[1] == 22]


def test_clone_fetch_push_over_ssh_with_no_configuration(world, user, sshd):
    sshd.client(user)
    work = world.workdir(user)
    branch = f"from-{user}"
    script = (f"git clone -q {url(sshd)} repo && cd repo && cat README && "
              f"echo change > change && git add change && "
              f"git -c user.name=agent -c user.email=agent@example.invalid commit -q -m change && "
              f"git push -q origin HEAD:refs/heads/{branch} && git fetch -q origin && "
              f"git rev-parse origin/{branch}")
    r = sshd.vpnw(["run", "--", "sh", "-c", script], user=user, cwd=work, timeout=120)
    assert r.returncode == 0, describe(r)
    assert "a repository served by the test world" in r.stdout
    assert f"refs/heads/{branch}" in sshd.branches()
    events = run_events(r)
    # clone, push and fetch: each one ssh connection to git.world:22, by name, through the SOCKS5 door.
    assert ssh_opened(events) == [(GIT_HOST, 22, "socks5")] * 3, opened(events)
    assert events[0]["fields"]["env_kept"] == []


def test_a_wrong_host_key_stops_ssh(world, user, sshd):
    # The known_hosts entry for git.world holds another key: ssh must refuse,
    # which shows that the host name it checks is git.world (the name travels
    # to the door unresolved).
    if not (world.tmp / f"wrong-{user}").exists():
        _check(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(world.tmp / f"wrong-{user}")])
    other = " ".join((world.tmp / f"wrong-{user}.pub").read_text().split()[:2])
    sshd.client(user, host_key=other)
    try:
        work = world.workdir(user)
        r = sshd.vpnw(["run", "--", "git", "clone", "-q", url(sshd), "repo"], user=user, cwd=work,
                       timeout=120)
        assert r.returncode == 128, describe(r)
        assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in r.stderr or \
            "Host key verification failed" in r.stderr, describe(r)
        assert ssh_opened(run_events(r)) == [(GIT_HOST, 22, "socks5")]
    finally:
        sshd.client(user)


def test_a_user_git_ssh_command_is_kept_and_recorded(world, user, sshd):
    sshd.client(user)
    work = world.workdir(user)
    mine = "ssh -o BatchMode=yes"   # no ProxyCommand: it cannot get out, and vpnw says why
    r = sshd.vpnw(["run", "--", "git", "clone", "-q", url(sshd), "repo"], user=user, cwd=work,
                   env={"GIT_SSH_COMMAND": mine}, timeout=120)
    assert r.returncode == 128, describe(r)
    events = run_events(r)
    assert events[0]["fields"]["env_kept"] == ["GIT_SSH_COMMAND"]
    assert mine not in "".join(str(e) for e in events)   # names, never values
    assert ssh_opened(events) == []
    assert "hint:" in r.stderr.strip().splitlines()[-1], describe(r)


def test_guard_allows_ssh_to_an_allowed_host(world, user, sshd):
    sshd.client(user)
    policy = world.file("git_ssh_allowed.toml",
                        f'version = 1\nname = "git"\n\n[policy]\ndefault = "deny"\ndeny_private = true\n'
                        f'allow = ["{GIT_HOST}:22"]\n')
    work = world.workdir(user)
    r = sshd.vpnw(["guard", "--policy", str(policy), "--", "git", "clone", "-q", url(sshd), "repo"],
                   user=user, cwd=work, timeout=120)
    assert r.returncode == 0, describe(r)
    assert (work / "repo" / "README").exists()
    events = run_events(r)
    assert ssh_opened(events) == [(GIT_HOST, 22, "socks5")]
    rules = [e["fields"]["rule"] for e in events if e["type"] == "policy.allow"]
    assert len(rules) == 1 and f"{GIT_HOST}:22" in rules[0], rules


def test_guard_denies_ssh_to_a_host_not_allowed_without_looking_it_up(world, user, sshd):
    sshd.client(user)
    policy = world.file("git_ssh_denied.toml",
                        'version = 1\nname = "git"\n\n[policy]\ndefault = "deny"\nallow = ["api.github.com"]\n')
    work = world.workdir(user)
    mark = world.dns_mark()
    r = sshd.vpnw(["guard", "--policy", str(policy), "--", "git", "clone", "-q", url(sshd), "repo"],
                   user=user, cwd=work, timeout=120)
    assert r.returncode == 120, describe(r)
    assert "denied by vpnw's policy" in r.stderr, describe(r)
    assert GIT_HOST not in world.dns_queries(since=mark)
    events = run_events(r)
    denials = [e for e in events if e["type"] == "policy.deny"]
    assert len(denials) == 1 and ssh_opened(events) == []
    request = next(e for e in events if e["type"] == "conn.request")
    assert (request["fields"]["host"], request["fields"]["port"], request["fields"]["kind"]) == (GIT_HOST, 22, "socks5")


def test_plain_ssh_and_scp_with_the_documented_proxy_command(world, user, sshd):
    # README: ssh -o 'ProxyCommand=vpnw-ssh-proxy %h %p' (the console script
    # installed beside vpnw), and `eval "$GIT_SSH_COMMAND ..."`.
    sshd.client(user)
    work = world.workdir(user)
    relay = world.vpnw_path.parent / "vpnw-ssh-proxy"
    (work / "upload.txt").write_text("sent with scp\n")
    target = f"{SERVER_USER}@{GIT_HOST}"
    uploads = sshd.dir / f"uploads-{user}"
    uploads.mkdir()
    os.chown(uploads, pwd.getpwnam(SERVER_USER).pw_uid, -1)
    remote = uploads / "upload.txt"
    script = (f"ssh -o 'ProxyCommand={relay} %h %p' {target} 'echo on $(hostname -s) as $(id -un)' && "
              f"scp -q -o 'ProxyCommand={relay} %h %p' upload.txt {target}:{remote} && "
              f"eval \"$GIT_SSH_COMMAND {target} cat {remote}\"")
    r = sshd.vpnw(["run", "--", "sh", "-c", script], user=user, cwd=work, timeout=120)
    assert r.returncode == 0, describe(r)
    assert f"as {SERVER_USER}" in r.stdout and "sent with scp" in r.stdout, describe(r)
    assert remote.read_text() == "sent with scp\n"
    assert ssh_opened(run_events(r)) == [(GIT_HOST, 22, "socks5")] * 3


def test_the_relay_outside_vpnw_says_where_it_belongs(world, user):
    relay = world.vpnw_path.parent / "vpnw-ssh-proxy"
    r = world.run([str(relay), GIT_HOST, "22"], user=user)
    assert r.returncode == 1 and "is this running inside vpnw?" in r.stderr, describe(r)
    r = world.run([str(relay), GIT_HOST], user=user)
    assert r.returncode == 2 and "usage" in r.stderr, describe(r)


# ── the user's ssh-agent, named in the policy (issue 26) ────────────────
AGENT_PASSPHRASE = "correct horse battery staple"


class Agent:
    """The user's own ssh-agent outside vpnw, holding a passphrase-protected
    key the server accepts; while it is used, the module's unencrypted key is
    put aside, so the agent is the only way in."""

    def __init__(self, world, sshd: SshServer, user: str):
        self.world, self.sshd, self.user = world, sshd, user
        home = sshd.home(user)
        self.ssh = home / ".ssh"
        self.key = self.ssh / "agent_key"
        if not self.key.exists():
            _check(["ssh-keygen", "-q", "-t", "ed25519", "-N", AGENT_PASSPHRASE, "-C",
                    f"{user} agent", "-f", str(self.key)])
            with open(sshd.keys, "a") as keys:
                keys.write((self.ssh / "agent_key.pub").read_text())
        askpass = home / "askpass.sh"
        askpass.write_text(f"#!/bin/sh\necho '{AGENT_PASSPHRASE}'\n")
        askpass.chmod(0o755)
        pw = pwd.getpwnam(user)
        for path in (self.key, self.ssh / "agent_key.pub", askpass):
            os.chown(path, pw.pw_uid, pw.pw_gid)
        self.sock = str(home / "agent.sock")
        if os.path.exists(self.sock):
            os.unlink(self.sock)
        self.proc = world.popen(["ssh-agent", "-D", "-a", self.sock], user=user,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(2000):
            if os.path.exists(self.sock):
                break
            time.sleep(0.005)
        world.run(["ssh-add", str(self.key)], user=user, check=True,
                  env={"SSH_AUTH_SOCK": self.sock, "SSH_ASKPASS": str(askpass),
                       "SSH_ASKPASS_REQUIRE": "force", "DISPLAY": ":0"})
        self.plain = self.ssh / "id_ed25519"
        os.rename(self.plain, self.ssh / "id_ed25519.aside")

    def stop(self) -> None:
        os.rename(self.ssh / "id_ed25519.aside", self.plain)
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def agent(world, user, sshd):
    sshd.client(user)
    a = Agent(world, sshd, user)
    try:
        yield a
    finally:
        a.stop()


def _agent_policy(world, with_rule: bool) -> Path:
    unix = '\n[unix]\nallow = ["$SSH_AUTH_SOCK"]\n' if with_rule else ""
    return world.file(f"git_ssh_agent_{with_rule}.toml",
                      f'version = 1\nname = "git"\n\n[policy]\ndefault = "deny"\n'
                      f'allow = ["{GIT_HOST}:22"]\n{unix}')


def test_clone_through_the_users_agent_named_in_the_policy(world, user, sshd, agent):
    work = world.workdir(user)
    policy = _agent_policy(world, with_rule=True)
    r = sshd.vpnw(["guard", "--policy", str(policy), "--", "git", "clone", "-q", url(sshd),
                   "repo-agent"], user=user, cwd=work, env={"SSH_AUTH_SOCK": agent.sock},
                  timeout=120)
    assert r.returncode == 0, describe(r)
    assert (work / "repo-agent" / "README").exists()
    events = run_events(r)
    allowed = [e["fields"] for e in events if e["type"] == "unix.allow"]
    assert allowed and all(f["path"] == agent.sock and f["rule"] == "$SSH_AUTH_SOCK"
                           and f["program"] == "ssh" for f in allowed), allowed
    assert not [e for e in events if e["type"] == "unix.deny"]
    assert ssh_opened(events) == [(GIT_HOST, 22, "socks5")]


def test_without_the_rule_the_agent_is_refused_and_the_record_says_so(world, user, sshd, agent):
    work = world.workdir(user)
    policy = _agent_policy(world, with_rule=False)
    r = sshd.vpnw(["guard", "--policy", str(policy), "--", "git", "clone", "-q", url(sshd),
                   "repo-no-agent"], user=user, cwd=work, env={"SSH_AUTH_SOCK": agent.sock},
                  timeout=120)
    assert r.returncode == 128, describe(r)
    assert "Permission denied" in r.stderr, describe(r)
    events = run_events(r)
    denied = [e["fields"] for e in events if e["type"] == "unix.deny"]
    assert denied and denied[0]["path"] == agent.sock and denied[0]["program"] == "ssh", denied
    assert denied[0]["reason"] == "a socket bound outside the sandbox"
    assert not [e for e in events if e["type"] == "unix.allow"]
    # Control: outside vpnw, the same agent lets the same clone in.
    outside = sshd.run(["git", "clone", "-q", url(sshd), "repo-outside"], user=user, cwd=work,
                       env={"SSH_AUTH_SOCK": agent.sock}, timeout=120)
    assert outside.returncode == 0, describe(outside)


# ------------------------------------------- plain ssh and git under --capture

# No proxy variable and no GIT_SSH_COMMAND: ssh and git as they run anywhere
# (ssh reads no proxy variable); the name resolves at the DNS door to a
# made-up address, the connection lands on the capture door, and the broker
# decides git.world:22 by name.
PLAIN = ["env", "-u", "GIT_SSH_COMMAND", "-u", "GIT_SSH", "-u", "HTTP_PROXY", "-u", "HTTPS_PROXY",
         "-u", "ALL_PROXY", "-u", "http_proxy", "-u", "https_proxy", "-u", "all_proxy"]
SSH_T = ["ssh", "-T", "-o", "BatchMode=yes", f"{SERVER_USER}@{GIT_HOST}", "echo", "hello from git.world"]


def _plain_script(server: SshServer) -> str:
    return (f"{' '.join(SSH_T[:-2])} echo 'hello from git.world' && "
            f"git clone -q {url(server)} repo && cat repo/README")


def _captured(events) -> list:
    return [(e["fields"]["host"], e["fields"]["port"], e["fields"]["door"]) for e in events
            if e["type"] == "conn.request"]


def test_plain_ssh_and_git_control_outside_vpnw(world, user, sshd):
    sshd.client(user)
    work = world.workdir(user)
    r = sshd.run([*PLAIN, "sh", "-c", f"rm -rf repo && {_plain_script(sshd)}"], user=user, cwd=work)
    assert r.returncode == 0, describe(r)
    assert "hello from git.world" in r.stdout and "a repository served by the test world" in r.stdout


@pytest.mark.parametrize("mode", ["trace", "guard"])
def test_plain_ssh_and_git_clone_are_captured_by_name(world, user, sshd, mode):
    sshd.client(user)
    work = world.workdir(user)
    policy = world.file(f"git_ssh_capture_{user}.toml",
                        f'version = 1\n[policy]\ncapture = true\ndefault = "deny"\nallow = ["{GIT_HOST}:22"]\n')
    args = ["trace", "--capture"] if mode == "trace" else ["guard", "--policy", str(policy)]
    r = sshd.vpnw([*args, "--", *PLAIN, "sh", "-c", f"rm -rf repo && {_plain_script(sshd)}"],
                   user=user, cwd=work, timeout=120)
    assert r.returncode == 0, describe(r)
    assert "hello from git.world" in r.stdout and "a repository served by the test world" in r.stdout
    events = run_events(r)
    assert events[0]["fields"]["capture"] is True
    # ssh -T, then git clone: each one connection to git.world:22, by name, at the capture door.
    assert _captured(events) == [(GIT_HOST, 22, "capture")] * 2, describe(r)
    assert ssh_opened(events) == [(GIT_HOST, 22, "capture")] * 2, opened(events)
    if mode == "guard":
        rules = [e["fields"]["rule"] for e in events if e["type"] == "policy.allow"]
        assert len(rules) == 2 and all(f"{GIT_HOST}:22" in rule for rule in rules), rules


@pytest.mark.parametrize("program", ["ssh", "git"])
def test_plain_ssh_and_git_denied_under_capture_without_a_lookup(world, user, sshd, program):
    sshd.client(user)
    work = world.workdir(user)
    policy = world.file(f"git_ssh_capture_deny_{user}.toml",
                        'version = 1\n[policy]\ncapture = true\ndefault = "deny"\nallow = ["api.github.com"]\n')
    argv = SSH_T if program == "ssh" else ["git", "clone", "-q", url(sshd), "repo-denied"]
    mark = world.dns_mark()
    r = sshd.vpnw(["guard", "--policy", str(policy), "--", *PLAIN, *argv], user=user, cwd=work,
                   timeout=120)
    assert r.returncode == 120, describe(r)
    assert GIT_HOST not in world.dns_queries(since=mark)
    events = run_events(r)
    assert _captured(events) == [(GIT_HOST, 22, "capture")]
    denials = [e for e in events if e["type"] == "policy.deny"]
    assert len(denials) == 1 and ssh_opened(events) == [], describe(r)
