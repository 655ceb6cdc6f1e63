"""Hand-written runs, as vpnw would record them, for the recorder and learner tests.

`python tests/golden/make_records.py` rewrites the .jsonl files beside it.
The .toml drafts beside them are checked by hand: regenerate them only after
reading the diff (`VPNW_UPDATE_GOLDEN=1 pytest tests/test_learner_golden.py`).
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from stages.record.events import encode  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
T0 = 1_790_682_276_000_000_000  # 2026-09-29T11:44:36Z


class RunWriter:
    """Builds one run's lines with a fake clock (1 ms per event unless told)."""

    def __init__(self, run: str, path: str = "direct", start_ns: int = T0,
                 orchestrator_pid: int = 16917, broker_pid: int = 16919):
        self.run, self.path, self.now = run, path, start_ns
        self.opid, self.bpid = orchestrator_pid, broker_pid
        self.lines: list[bytes] = []
        self.conn = 0

    def emit(self, type_, conn=None, *, by="broker", after_ms=1.0, **fields):
        self.now += int(after_ms * 1_000_000)
        pid = self.bpid if by == "broker" else self.opid
        self.lines.append(encode(self.run, type_, fields, path=self.path, conn=conn,
                                 pid=pid, ts_ns=self.now))

    def start(self, mode, program, policy=None, policy_file=None, dry_run=False, record=None):
        self.emit("run.start", by="orchestrator", after_ms=0, mode=mode, program=program,
                  policy=policy, policy_file=policy_file, via=self.path, dry_run=dry_run,
                  allow_unix_sockets=False, version="0.1.0",
                  record=record or f"/root/.local/state/vpnw/runs/{self.run}.jsonl")
        self.emit("path.check", path=self.path, type="direct", ok=True, ms=0.4)
        self.emit("sandbox.ready", by="orchestrator", after_ms=30,
                  namespaces=["user", "net", "pid", "ipc", "mnt"], seccomp=True,
                  unix_sockets=False, unix="own", doors={"http": 3128, "socks": 1080})

    def unix(self, path, *, process, program, rule=None, reason=None, after_ms=5.0):
        """A connect() the Unix-socket supervisor refused (reason) or allowed by the policy (rule)."""
        if rule is not None:
            self.emit("unix.allow", by="orchestrator", after_ms=after_ms, path=path,
                      process=process, program=program, rule=rule)
        else:
            self.emit("unix.deny", by="orchestrator", after_ms=after_ms, path=path,
                      process=process, program=program, reason=reason)

    def connect(self, host, port, *, kind="http-connect", addresses=None, address=None,
                up=0, down=0, ms=12.0, dial_ms=0.3, rule="default", reason=None,
                deny=None, enforced=True, fail=None, after_ms=40.0):
        """One connection from request to its end. deny: (rule, reason);
        fail: (stage, error, reason)."""
        self.conn += 1
        c = self.conn
        door = "socks" if kind == "socks5" else "http"
        self.emit("conn.request", c, after_ms=after_ms, door=door, kind=kind, host=host, port=port)
        if deny is not None:
            self.emit("policy.deny", c, rule=deny[0], reason=deny[1], enforced=enforced,
                      host=host, port=port, door=door)
            if enforced:
                return
        if addresses is not None:
            self.emit("dns.resolve", c, host=host, addresses=addresses, ms=2.1)
        if fail is not None and fail[0] == "resolve":
            self.emit("dns.resolve", c, host=host, addresses=[], ms=5.0, error="NXDOMAIN")
            self.emit("conn.fail", c, stage=fail[0], error=fail[1], reason=fail[2])
            return
        if deny is None:
            self.emit("policy.allow", c, rule=rule,
                      reason=reason or "no policy: every destination is allowed (trace)",
                      host=host, port=port, door=door)
        if fail is not None:
            self.emit("conn.fail", c, stage=fail[0], error=fail[1], reason=fail[2])
            return
        self.emit("conn.open", c, address=address or (addresses or [host])[0], port=port,
                  via=self.path, ms=dial_ms)
        self.emit("conn.close", c, after_ms=ms, bytes_up=up, bytes_down=down, ms=ms)

    def end(self, exit_code=0, code=0, signal=None, held=None):
        denied = sum(1 for line in self.lines if b'"policy.deny"' in line and b'"enforced":true' in line)
        would = sum(1 for line in self.lines if b'"policy.deny"' in line and b'"enforced":false' in line)
        failed = sum(1 for line in self.lines if b'"conn.fail"' in line)
        self.emit("program.exit", by="orchestrator", after_ms=5, code=code, signal=signal)
        if held:
            self.emit("files.held", by="orchestrator", count=len(held), entries=held, truncated=False)
        self.emit("run.end", by="orchestrator", exit_code=exit_code, connections=self.conn,
                  denied=denied, would_deny=would, failed=failed,
                  ms=round((self.now - T0) / 1e6, 3))

    def text(self) -> bytes:
        return b"".join(self.lines)


def demo_agent_trace() -> RunWriter:
    """The demo: an agent does its work, and a prompt injection makes it leak
    a token to evil.example, directly and spelled into DNS names."""
    w = RunWriter("r-36e0ba")
    w.start("trace", "agent")
    gh = ["140.82.112.6"]
    w.connect("api.github.com", 443, addresses=gh, up=1840, down=52311, ms=180)
    w.connect("api.github.com", 443, addresses=gh, up=2210, down=8150, ms=95)
    w.connect("raw.githubusercontent.com", 443, addresses=["185.199.108.133"], up=900,
              down=3_400_000, ms=420)
    w.connect("objects.githubusercontent.com", 443, addresses=["185.199.109.133"], up=880,
              down=1_200_000, ms=300)
    w.connect("avatars.githubusercontent.com", 443, addresses=["185.199.110.133"], up=700,
              down=24_000, ms=40)
    w.connect("pypi.org", 443, addresses=["151.101.0.223"], up=1100, down=45_000, ms=60)
    w.connect("files.pythonhosted.org", 443, addresses=["151.101.1.63"], up=1300,
              down=2_300_000, ms=700)
    w.connect("example.com", 80, kind="http-forward", addresses=["93.184.215.14"], up=120,
              down=1256, ms=20)
    w.connect("example.com", 443, addresses=["93.184.215.14"], up=600, down=3000, ms=30)
    # The leak: the token goes to the attacker's server...
    w.connect("evil.example", 443, addresses=["185.220.101.4"], up=48_213, down=310, ms=90)
    # ...and is spelled into names under its zone (a DNS tunnel's shape).
    for label in ("mzxw6ytboi2dsmrsgq3dknzq", "gezdgnbvgy3tqojqgezdgnbv", "k5xw4zltnfxgo2lbnzsw"):
        w.connect(f"{label}.t.evil.example", 443, addresses=["185.220.101.5"], up=400, down=90, ms=10)
    # The cloud metadata address, asked for by number through SOCKS.
    w.connect("169.254.169.254", 80, kind="socks5", up=220, down=1400, ms=8)
    # An address with no name, on an odd port.
    w.connect("203.0.113.50", 8443, kind="socks5", up=5000, down=7000, ms=50)
    w.connect("nonexistent.example", 443,
              fail=("resolve", "dns", "nonexistent.example does not exist (NXDOMAIN)"))
    # The agent asks the Docker daemon to run something for it.
    w.unix("/var/run/docker.sock", process=14, program="curl",
           reason="a socket bound outside the sandbox")
    w.end(exit_code=0)
    return w


def pip_guard_run() -> RunWriter:
    """pip install under a policy: the package index is allowed, a telemetry
    host is denied (vpnw exits 120)."""
    w = RunWriter("r-7c01d2", start_ns=T0 + 3_600_000_000_000, orchestrator_pid=20001,
                  broker_pid=20003)
    w.start("guard", "pip", policy="pip", policy_file="/home/dev/pip.toml")
    # A git+ssh requirement: git's ssh asks the user's agent, which the policy names.
    w.unix("/run/user/1000/ssh-agent.sock", process=9, program="ssh",
           rule="$SSH_AUTH_SOCK")
    allow_pypi = ("pypi.org", "allow rule pypi.org matches (pip.toml line 6)")
    allow_files = ("*.pythonhosted.org", "allow rule *.pythonhosted.org matches (pip.toml line 6)")
    w.connect("pypi.org", 443, addresses=["151.101.0.223"], rule=allow_pypi[0],
              reason=allow_pypi[1], up=1900, down=120_000, ms=150)
    for size in (2_300_000, 640_000, 89_000):
        w.connect("files.pythonhosted.org", 443, addresses=["151.101.1.63"], rule=allow_files[0],
                  reason=allow_files[1], up=1400, down=size, ms=400)
    w.connect("telemetry.example.net", 443,
              deny=("default", "no allow rule matches telemetry.example.net:443; default is deny "
                    "(set in the policy)"))
    w.connect("pypi.org", 443, addresses=["151.101.0.223"], rule=allow_pypi[0],
              reason=allow_pypi[1], fail=("dial", "timeout", "151.101.0.223:443 did not answer "
                                          "within 10 s"))
    w.end(exit_code=120)
    return w


def dry_run_guard() -> RunWriter:
    """guard --dry-run: a denial is only reported, and the connection goes on."""
    w = RunWriter("r-d2a9f0", start_ns=T0 + 7_200_000_000_000, orchestrator_pid=30001,
                  broker_pid=30003)
    w.start("guard", "node", policy="agent", policy_file="/home/dev/agent.toml", dry_run=True)
    w.connect("registry.npmjs.org", 443, addresses=["104.16.1.35"], rule="registry.npmjs.org",
              reason="allow rule registry.npmjs.org matches (agent.toml line 6)", up=900, down=80_000)
    w.connect("2001:db8:85a3::8a2e:370:7334", 8080, kind="socks5", deny=(
        "default", "no allow rule matches [2001:db8:85a3::8a2e:370:7334]:8080; default is deny "
        "(set in the policy)"), enforced=False, address="2001:db8:85a3::8a2e:370:7334",
        up=10, down=20)
    w.end(exit_code=0)
    return w


def capture_trace() -> RunWriter:
    """trace --capture: ssh resolves through the DNS door and connects to the
    made-up address; the capture door decides the name."""
    w = RunWriter("r-c4f7e1", start_ns=T0 + 10_800_000_000_000, orchestrator_pid=40001,
                  broker_pid=40003)
    w.start("trace", "ssh")
    w.lines[0] = w.lines[0].replace(b'"record":', b'"capture":true,"record":')
    w.lines[2] = w.lines[2].replace(b'"socks":1080}', b'"socks":1080,"capture":1081,"dns":53}')
    w.emit("dns.answer", name="git.world", type="A", rcode="NOERROR", address="198.18.33.7",
           transport="udp")
    w.emit("dns.answer", name="git.world", type="AAAA", rcode="NODATA", transport="udp",
           after_ms=0.1)
    w.emit("dns.answer", name="exfil.example", type="TXT", rcode="NODATA", transport="udp")
    w.emit("dns.answer", name="x.example", type="ANY", rcode="REFUSED", transport="tcp",
           reason="ANY queries are never answered")
    w.conn += 1
    w.emit("conn.request", w.conn, door="capture", kind="capture", host="git.world", port=22,
           fake_address="198.18.33.7")
    w.emit("dns.resolve", w.conn, host="git.world", addresses=["140.82.113.4"], ms=1.2)
    w.emit("policy.allow", w.conn, rule="no policy",
           reason="no policy: every connection is allowed", host="git.world", port=22,
           door="capture")
    w.emit("conn.open", w.conn, address="140.82.113.4", port=22, via="direct", ms=0.4)
    w.emit("conn.close", w.conn, after_ms=80, bytes_up=3100, bytes_down=4200, ms=80)
    # A trace has no [files]: what it wrote outside its work set was held.
    w.end(exit_code=0, held=[
        {"path": "/root/.ssh/known_hosts", "kind": "file", "size": 142,
         "sha256": "9f2c1be0c0c8d7a4b5e3a1f0d9c8b7a6e5d4c3b2a1f0e9d8c7b6a5f4e3d2c1b0",
         "runs_later": None},
        {"path": "/root/.bashrc", "kind": "file", "size": 3106,
         "sha256": "1b4f0e9869a5c3c6b2d8f7e4a3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4",
         "runs_later": "shell start-up"}])
    return w


RECORDS = {
    "capture_trace": capture_trace,
    "demo_agent_trace": demo_agent_trace,
    "pip_guard": pip_guard_run,
    "dry_run_guard": dry_run_guard,
}


def main() -> None:
    for name, build in RECORDS.items():
        with open(os.path.join(HERE, f"{name}.jsonl"), "wb") as f:
            f.write(build().text())


if __name__ == "__main__":
    main()
