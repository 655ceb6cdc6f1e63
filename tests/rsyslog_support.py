"""A real rsyslogd from Debian, started by a test inside the test world.

Each instance has its own config, work directory, pid file and sockets under
world.tmp; it never opens /dev/log (imuxsock's system socket is off) and
listens only on the world namespace's own loopback. It parses every message
with mmjsonparse (the `@cee:` cookie) and writes one JSON line per message to
`parsed.jsonl`: the syslog header fields rsyslog saw and the parsed document.

    {"hostname": ..., "app": "vpnw", "procid": "1234", "msgid": "policy.deny",
     "severity": "4", "facility": "1", "doc": {...the event or document...}}

A message that does not parse goes to `unparsed.log`. A sender instance
(`forward_to`) forwards everything to another rsyslogd over TCP instead, as
a machine of a fleet would.
"""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

RSYSLOGD = shutil.which("rsyslogd") or "/usr/sbin/rsyslogd"

PARSE_AND_WRITE = """
template(name="vpnw_parsed" type="string" string="%$.rec%\\n")
ruleset(name="vpnw") {{
  action(type="mmjsonparse" cookie="@cee:")
  if $parsesuccess == "OK" then {{
    set $.rec!hostname = $hostname;
    set $.rec!app = $app-name;
    set $.rec!procid = $procid;
    set $.rec!msgid = $msgid;
    set $.rec!severity = $syslogseverity;
    set $.rec!facility = $syslogfacility;
    set $.rec!doc = $!;
    action(type="omfile" file="{dir}/parsed.jsonl" template="vpnw_parsed")
  }} else {{
    action(type="omfile" file="{dir}/unparsed.log" template="RSYSLOG_SyslogProtocol23Format")
  }}
}}
"""

FORWARD = """
ruleset(name="vpnw") {{
  if $app-name == "vpnw" then {{
    action(type="omfwd" target="127.0.0.1" port="{port}" protocol="tcp"
           TCP_Framing="octet-counted" template="RSYSLOG_SyslogProtocol23Format"
           queue.type="LinkedList" action.resumeRetryCount="-1")
    stop
  }}
}}
"""


class Rsyslog:
    def __init__(self, world, name: str, *, udp_port: int | None = None, tcp_port: int | None = None,
                 unix: bool = True, hostname: str | None = None, forward_to: int | None = None,
                 discard: bool = False):
        self.world = world
        self.dir = world.tmp / f"rsyslog-{name}"
        self.dir.mkdir(mode=0o755)
        self.socket = self.dir / "log.sock" if unix else None
        self.udp_port, self.tcp_port = udp_port, tcp_port
        self.hostname = hostname
        self.forward_to = forward_to
        self.discard = discard       # take every message and keep none (benchmarks)
        self.proc: subprocess.Popen | None = None

    @property
    def parsed_file(self) -> Path:
        return self.dir / "parsed.jsonl"

    def config(self) -> str:
        lines = [f'global(workDirectory="{self.dir}" maxMessageSize="64k"'
                 + (f' localHostname="{self.hostname}"' if self.hostname else "") + ")",
                 # SysSock.Use="off": never the machine's /dev/log.
                 'module(load="imuxsock" SysSock.Use="off")', 'module(load="mmjsonparse")']
        if self.udp_port:
            lines.append('module(load="imudp")')
        if self.tcp_port:
            lines.append('module(load="imtcp")')
        if self.discard:
            lines.append('template(name="vpnw_nothing" type="string" string="")\n'
                         'ruleset(name="vpnw") { action(type="omfile" file="/dev/null" template="vpnw_nothing") }')
        elif self.forward_to:
            lines.append(FORWARD.format(port=self.forward_to))
        else:
            lines.append(PARSE_AND_WRITE.format(dir=self.dir))
        if self.socket:
            host = f' HostName="{self.hostname}"' if self.hostname else ""
            lines.append(f'input(type="imuxsock" Socket="{self.socket}" ruleset="vpnw"{host})')
        if self.udp_port:
            lines.append(f'input(type="imudp" address="127.0.0.1" port="{self.udp_port}" ruleset="vpnw")')
        if self.tcp_port:
            lines.append(f'input(type="imtcp" address="127.0.0.1" port="{self.tcp_port}" ruleset="vpnw")')
        return "\n".join(lines) + "\n"

    def start(self) -> "Rsyslog":
        conf = self.dir / "rsyslog.conf"
        conf.write_text(self.config())
        check = subprocess.run([RSYSLOGD, "-N1", "-f", str(conf)], capture_output=True, text=True)
        assert check.returncode == 0, check.stderr
        pidfile = self.dir / "rsyslogd.pid"
        self.proc = subprocess.Popen(
            ["nsenter", "-t", str(self.world.world_pid), "-n", "-m", "--",
             RSYSLOGD, "-n", "-f", str(conf), "-i", str(pidfile)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(self.dir / "stderr", "wb"))
        self.world._started.append(self.proc)
        self._await_ready()
        return self

    def _await_ready(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.dir / "stderr").read_text()
            if (not self.socket or self.socket.exists()) and self._ports_listen():
                return
            time.sleep(0.05)
        raise AssertionError(f"rsyslogd in {self.dir} did not start listening")

    def _ports_listen(self) -> bool:
        out = subprocess.run(["nsenter", "-t", str(self.world.world_pid), "-n", "--", "ss", "-Hlnut"],
                             capture_output=True, text=True).stdout
        return all(f"127.0.0.1:{port} " in out for port in (self.udp_port, self.tcp_port) if port)

    def all_records(self) -> list[dict]:
        if not self.parsed_file.exists():
            return []
        # rsyslog may be mid-write: only whole lines count.
        lines = self.parsed_file.read_bytes().split(b"\n")[:-1]
        return [json.loads(line) for line in lines if line.strip()]

    def records(self) -> list[dict]:
        """The events' messages (the chain's heads, docs/record.md, are heads())."""
        return [r for r in self.all_records() if "vpnw_chain" not in r.get("doc", {})]

    def heads(self) -> list[dict]:
        return [r["doc"]["vpnw_chain"] for r in self.all_records() if "vpnw_chain" in r.get("doc", {})]

    def unparsed(self) -> str:
        path = self.dir / "unparsed.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def await_records(self, done, timeout: float = 60) -> list[dict]:
        """The records once `done(records)` holds (rsyslog writes
        asynchronously); the last read if it never does."""
        deadline = time.monotonic() + timeout
        while True:
            records = self.records()
            if done(records) or time.monotonic() > deadline:
                return records
            time.sleep(0.1)

    def await_quiet(self, expected: int, quiet: float = 3.0, timeout: float = 300) -> tuple[int, float]:
        """(records written, monotonic time of the last one seen) once
        `expected` are in or nothing new came for `quiet` seconds."""
        deadline = time.monotonic() + timeout
        count, last = -1, time.monotonic()
        while time.monotonic() < deadline:
            now_count = len(self.parsed_file.read_bytes().split(b"\n")) - 1 if self.parsed_file.exists() else 0
            if now_count != count:
                count, last = now_count, time.monotonic()
            if count >= expected or time.monotonic() - last > quiet:
                break
            time.sleep(0.02)
        return count, last

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
