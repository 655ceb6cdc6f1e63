"""The bypass bench: the targets outside the sandbox, and the probe runs.

Every attempt runs through `tests/progs/bypass_probe.py` (one forked child per
attempt, one JSON line each). A batch of attempts costs one `vpnw run` per
user; each attempt is still asserted by a test of its own. Controls run the
same plan in the world as the same user ("world"), or in a scratch user+net+
mount namespace of that user's own ("scratch"), where the user holds every
capability over a network nothing else uses: proof that the attempt works
when nothing refuses it, without touching the world's network.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import NamedTuple

import pytest

from stages.record.check import check_run
from world import WorldError

PROGS = Path(__file__).resolve().parent.parent / "progs"
PYTHON = "/usr/bin/python3"          # Debian's, as the brief asks: readable by every user
WORLD_HOST_V4, WORLD_HOST_V6 = "140.82.112.6", "2606:50c0:8000::154"   # api.github.com, dual.world
BROKER_V4, BROKER_V6 = "10.200.0.1", "fd00:200::1"                     # the world's own addresses
TARGET_TCP, TARGET_UDP = 8000, 7007
PING_RANGE_OPEN = "0 2147483647"


def describe(r) -> str:
    return f"exit {r.returncode}\n--- stdout\n{r.stdout}\n--- stderr\n{r.stderr}"


def parse_results(r) -> dict[str, dict]:
    out = {}
    for line in r.stdout.splitlines():
        if line.startswith("{"):
            res = json.loads(line)
            out[res.pop("id")] = res
    return out


class Bench:
    def __init__(self, world):
        self.world = world
        self._cleanups: list = []
        self._cache: dict = {}
        self._per_user: dict = {}
        self.dir = world.tmp / "bypass"
        self.dir.mkdir(exist_ok=True)
        self.dir.chmod(0o755)
        self.probe = world.file("bypass_probe.py", (PROGS / "bypass_probe.py").read_bytes())
        self.int80 = None
        if shutil.which("gcc"):
            out = world.tmp / "files" / "bypass_int80"
            if subprocess.run(["gcc", "-O0", "-o", str(out), str(PROGS / "bypass_int80.c")],
                              capture_output=True).returncode == 0:
                out.chmod(0o755)
                self.int80 = str(out)
        self._start_targets()

    # ── targets outside the sandbox ─────────────────────────────────────
    def _start_targets(self) -> None:
        w = self.world
        targets = w.file("bypass_targets.py", (PROGS / "bypass_targets.py").read_bytes())
        self.unix_path = str(self.dir / "targets.sock")
        self.abstract = f"vpnw-bypass-{os.getpid()}"
        self.seqpacket_path = str(self.dir / "seqpacket.sock")
        self.dgram_path = str(self.dir / "dgram.sock")
        self.dgram_abstract = f"vpnw-bypass-dgram-{os.getpid()}"
        self.received = self.dir / "received"
        self.received.mkdir(exist_ok=True)
        self.received.chmod(0o755)
        # In the world: the broker machine's listeners (loopback, its own
        # addresses, Unix listeners by path and abstract name, and Unix
        # datagram sockets like journald's, which log what reaches them).
        world_targets = w.popen([PYTHON, str(targets), "--tcp", str(TARGET_TCP),
                                 "--unix", self.unix_path, "--abstract", self.abstract,
                                 "--unix-seqpacket", self.seqpacket_path,
                                 "--unix-dgram", self.dgram_path,
                                 "--abstract-dgram", self.dgram_abstract,
                                 "--received", str(self.received)],
                                stdout=subprocess.PIPE)
        # In the internet: a UDP echo on every address.
        internet_targets = subprocess.Popen(
            ["nsenter", "-t", str(w.internet_pid), "-n", "--", PYTHON, str(targets),
             "--udp", str(TARGET_UDP)], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        for proc in (world_targets, internet_targets):
            self._cleanups.append(lambda p=proc: (p.kill(), p.wait()))
            line = proc.stdout.readline()
            if line != b"ready\n":
                raise WorldError(f"bypass targets did not start: {line!r}, exit {proc.poll()}")
        # Ping sockets: the world's range opened so the control can work;
        # the sandbox's fresh namespace keeps the kernel default ("1 0").
        old = w.run(["sysctl", "-n", "net.ipv4.ping_group_range"], check=True).stdout.split()
        w.run(["sysctl", "-w", f"net.ipv4.ping_group_range={PING_RANGE_OPEN}"], check=True)
        self._cleanups.append(lambda: w.run(["sysctl", "-w", f"net.ipv4.ping_group_range={' '.join(old)}"]))

    def _await_sleep(self, proc) -> int:
        for _ in range(2000):
            try:
                if Path(f"/proc/{proc.pid}/comm").read_text().strip() == "sleep":
                    return proc.pid
            except OSError:
                break
            time.sleep(0.005)
        raise WorldError("a sleeper did not start")

    def targets_for(self, user: str) -> dict[str, str]:
        """Per-user things outside: a sleeper, a namespace holder (also bind-
        mounted into world.tmp), SysV IPC objects made with ipcmk."""
        if user in self._per_user:
            return self._per_user[user]
        w = self.world
        t: dict[str, str] = {"unix_path": self.unix_path, "abstract": self.abstract,
                             "seqpacket_path": self.seqpacket_path, "dgram_path": self.dgram_path,
                             "dgram_abstract": self.dgram_abstract, "received": str(self.received),
                             "int80": self.int80 or "/nonexistent"}
        sleeper = w.popen(["sleep", "600"], user=user)
        t["sleeper"] = str(self._await_sleep(sleeper))
        holder = w.popen(["unshare", "-Urn", "--", "sleep", "600"], user=user)
        t["holder"] = str(self._await_sleep(holder))
        for proc in (sleeper, holder):
            self._cleanups.append(lambda p=proc: (p.kill(), p.wait()))
        for kind in ("user", "net"):
            path = self.dir / f"ns-{kind}-{user}"
            path.touch()
            w.run(["mount", "--bind", f"/proc/{t['holder']}/ns/{kind}", str(path)], check=True)
            self._cleanups.append(lambda p=path: w.run(["umount", str(p)]))
            t[f"bind_{kind}"] = str(path)
        for kind, flag, args in (("shm", "-M", ["4096"]), ("msg", "-Q", []), ("sem", "-S", ["1"])):
            out = w.run(["ipcmk", flag, *args, "-p", "0600"], user=user, check=True).stdout
            ipc_id = re.search(r"id: (\d+)", out).group(1)
            self._cleanups.append(lambda k=kind, i=ipc_id: w.run(
                ["ipcrm", {"shm": "-m", "msg": "-q", "sem": "-s"}[k], i], user=user))
            for line in Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[1:]:
                key, found_id = line.split()[:2]
                if found_id == ipc_id:
                    t[f"{kind}_key"] = hex(int(key) & 0xFFFFFFFF)
        self._per_user[user] = t
        return t

    # ── running plans ───────────────────────────────────────────────────
    def _plan_file(self, name: str, user: str, plan: list[dict]) -> str:
        t = self.targets_for(user)
        concrete = [{**a, "args": [str(x).format(**t) for x in a.get("args", [])]} for a in plan]
        return str(self.world.file(f"plan-{name}-{user}.json", json.dumps(concrete)))

    def inside(self, name: str, user: str, plan: list[dict], vpnw_args=("run",),
               expect_exit: int = 0, env: dict | None = None) -> tuple[dict[str, dict], list[dict]]:
        """Run the plan sealed; return (results by id, the run's events).
        `env`: more of vpnw's own environment (part of what the run is cached by)."""
        key = ("inside", name, user, tuple(sorted((env or {}).items())))
        if key not in self._cache:
            plan_file = self._plan_file(name, user, plan)
            r = self.world.vpnw([*vpnw_args, "--", PYTHON, str(self.probe), plan_file],
                                user=user, timeout=300, env=env)
            assert r.returncode == expect_exit, describe(r)
            results = parse_results(r)
            assert set(results) == {a["id"] for a in plan}, describe(r)
            events = r.events()
            problems = check_run(events)
            assert not problems, problems
            self._cache[key] = (results, events)
        return self._cache[key]

    def control(self, name: str, user: str, plan: list[dict], where: str) -> dict[str, dict]:
        key = ("control", name, user, where)
        if key not in self._cache:
            chosen = [{**a, "args": a.get("control_args", a.get("args", []))}
                      for a in plan if a.get("control") == where]
            plan_file = self._plan_file(f"{name}-{where}", user, chosen)
            prefix = ["unshare", "-Urnm", "--"] if where == "scratch" else []
            r = self.world.run([*prefix, PYTHON, str(self.probe), plan_file], user=user, timeout=300)
            assert r.returncode == 0, describe(r)
            results = parse_results(r)
            assert set(results) == {a["id"] for a in chosen}, describe(r)
            self._cache[key] = results
        return self._cache[key]

    def stop(self) -> None:
        for cleanup in reversed(self._cleanups):
            try:
                cleanup()
            except Exception:  # noqa: BLE001 - every cleanup gets its turn
                pass


@pytest.fixture(scope="session")
def bench(world):
    b = Bench(world)
    try:
        yield b
    finally:
        b.stop()


def errnos(result: dict) -> set[str]:
    return set((result["errno"] or "").split(","))


# ── ways out as data: one table per test module ─────────────────────────
OK = "ok"


class Way(NamedTuple):
    id: str
    attempt: str
    args: tuple = ()
    accept: frozenset = frozenset()        # errors accepted inside
    control: str | None = None             # "world", "scratch" or None
    control_root: object = OK              # OK or a set of errors accepted in the control
    control_user: object = OK              # the same for vpnwtest
    control_args: tuple | None = None
    why_no_control: str = ""


def way(id, attempt, *args, accept, control=None, root=OK, user=OK, control_args=None, why=""):
    return Way(id, attempt, tuple(args), frozenset(accept), control, root, user, control_args, why)


def plan_of(ways: list[Way]) -> list[dict]:
    return [{"id": w.id, "attempt": w.attempt, "args": list(w.args), "control": w.control,
             **({"control_args": list(w.control_args)} if w.control_args is not None else {})}
            for w in ways]


def check_control(bench, user: str, name: str, plan: list[dict], w: Way) -> None:
    """The same attempt outside: it must work (OK), or end in one of the
    errors the way lists for that user's control."""
    if w.control is None:
        assert w.why_no_control, f"{w.id}: no control and no reason why"
        return
    res = bench.control(name, user, plan, w.control)[w.id]
    expected = w.control_root if user == "root" else w.control_user
    if expected == OK:
        assert res["ok"], f"control outside: the attempt itself must work: {res}"
    else:
        got = OK if res["ok"] else res["errno"]
        assert got in expected or (not res["ok"] and errnos(res) <= expected), \
            f"control outside: expected one of {sorted(expected)}, got {res}"
