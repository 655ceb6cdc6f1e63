"""The supervisor's two paths decide alike (issue 47): the compiled one
(stages/helper/supervisor/fast_continue.c, its decide() behind a mock of its
system calls: tests/progs/fast_continue_mock.c, built here with gcc, ASan and
UBSan) and the pure judge the Python path runs (stages/helper/supervisor/judge.py),
fed the same generated notifications in the same mock world (a thread, its
socket, the address in its memory, the file a path names, the recorded
socket files). The compiled path answers only what the judge would answer
the same way: its "continue" is the judge's, its connect is to the address
the judge would connect to, and anything else it hands to the Python path
(TO_PYTHON), with no connect made, no fd closed that it did not open, no
lookup under /proc. Thousands of table-driven cases, then hypothesis.

Controls: bugs planted in a copy of fast_continue.c (a check taken out, as
main had it before issue 47 for the cookie, the call, the TID and /../proc)
are each caught by the same cases.

And the findings of issue 47 against the pure judge itself: two files that
share an inode number are told apart; a socket made outside is refused; a
call or arch the filter never sends, and a TID of 0 or less, are refused."""
from __future__ import annotations

import errno
import itertools
import random
import shutil
import socket
import struct
import subprocess
import sysconfig
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from ci_support import cannot
from stages.helper.supervisor import judge as cj

REPO = Path(__file__).resolve().parent.parent
SOURCE = REPO / "stages" / "helper" / "supervisor" / "fast_continue.c"
MOCK = Path(__file__).resolve().parent / "progs" / "fast_continue_mock.c"
MOCKED = ("openat", "fstat", "syscall", "process_vm_readv", "getsockopt", "fcntl", "ioctl",
          "connect", "name_to_handle_at", "close")
X86_64, I386, AARCH64 = cj.AUDIT_ARCH_X86_64, 0x40000003, 0xC00000B7
SANDBOX, OUTSIDE = 7, 9                 # network namespace cookies
TID = 4321
TMPFS = 0x01021994


def build(into: Path, source: str | None = None, sanitize: bool = True) -> Path:
    gcc = shutil.which("gcc")
    if gcc is None:
        cannot("gcc is not installed (scripts/setup installs it)")
    directory = into / "src"
    directory.mkdir(exist_ok=True)
    (directory / "fast_continue.c").write_text(source if source is not None else SOURCE.read_text())
    out = into / "mock"
    flags = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-O1", "-g"] \
        if sanitize else ["-O0"]
    include = sysconfig.get_paths()["include"]
    subprocess.run([gcc, *flags, "-DFAST_CONTINUE_MOCK", *(f"-D{name}=mock_{name}" for name in MOCKED),
                    f"-I{directory}", f"-I{include}", str(MOCK), "-o", str(out)],
                   check=True, capture_output=True, text=True)
    return out


class Driver:
    """The mock, one case a line in and one answer a line out."""

    def __init__(self, binary: Path):
        self.proc = subprocess.Popen([str(binary)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, bufsize=1)

    def ask(self, case: dict) -> str:
        self.proc.stdin.write(line_of(case) + "\n")
        answer = self.proc.stdout.readline()
        assert answer, f"the mock ended (sanitizer?) on {line_of(case)}"
        return answer.strip()

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


# ---------------------------------------------------------------- the world

def sockaddr_in(address: bytes, port: int) -> bytes:
    return struct.pack("=H", socket.AF_INET) + struct.pack("!H", port) + address + bytes(8)


def sockaddr_in6(address: bytes, port: int) -> bytes:
    return struct.pack("=H", socket.AF_INET6) + struct.pack("!H", port) + bytes(4) + address + bytes(4)


def sockaddr_un(path: bytes) -> bytes:
    return struct.pack("=H", socket.AF_UNIX) + path


LOOPBACK6 = bytes(15) + b"\1"
MAPPED = bytes(10) + b"\xff\xff" + bytes([127, 0, 0, 1])
ADDRESSES = {
    "v4-loopback-listened": sockaddr_in(bytes([127, 0, 0, 1]), 8080),
    "v4-loopback-unlistened": sockaddr_in(bytes([127, 0, 0, 1]), 9),
    "v4-other": sockaddr_in(bytes([10, 0, 0, 1]), 443),
    "v6-loopback-listened": sockaddr_in6(LOOPBACK6, 8080),
    "v6-loopback-unlistened": sockaddr_in6(LOOPBACK6, 9),
    "v6-mapped-unlistened": sockaddr_in6(MAPPED, 9),
    "v6-other": sockaddr_in6(bytes([0x20, 1, 0xd, 0xb8]) + bytes(12), 443),
    "unix-path": sockaddr_un(b"/tmp/s.sock"),
    "unix-path-nul": sockaddr_un(b"/tmp/s.sock\0junk"),
    "unix-proc": sockaddr_un(b"/proc/self/root/run/bus"),
    "unix-dotdot-proc": sockaddr_un(b"/../proc/1/root/run/bus"),
    "unix-dot-proc": sockaddr_un(b"/./../proc/self/cwd/x"),
    "unix-procfoo": sockaddr_un(b"/procfoo/s.sock"),
    "unix-relative": sockaddr_un(b"s.sock"),
    "unix-abstract": sockaddr_un(b"\0name"),
    "unix-empty": sockaddr_un(b""),
    "unspec": struct.pack("=H", 0) + bytes(14),
    "v4-short": struct.pack("=H", socket.AF_INET) + b"\x1f",
}
HANDLE_A = bytes.fromhex("3e10efca05000000")         # tmpfs: generation, inode 5
HANDLE_B = bytes.fromhex("77aa0b1205000000")         # another generation, the same inode 5


def case(**given) -> dict:
    """A world where everything is as a plain connect of a thread alone
    finds it, but for what is given."""
    base = {"nr": cj.SYS_CONNECT, "arch": X86_64, "pid": TID, "tid": TID, "arg0": 3, "thread": 1,
            "threads": 1, "fd": 3, "domain": socket.AF_INET, "cookie": SANDBOX, "sandbox": SANDBOX,
            "nb": 1, "valid": 1, "address": "v4-other", "length": None, "memory": None,
            "target_errno": 0, "target_sock": 1, "dev": 2049, "ino": 5, "handle_errno": 0,
            "handle_type": 1, "handle": HANDLE_A, "fs_type": TMPFS, "listened": (8080,),
            "slots": ()}
    base.update(given)
    return base


def memory_of(c: dict) -> bytes | None:
    if c["memory"] == "unmapped":
        return None
    return c["memory"] if c["memory"] is not None else ADDRESSES[c["address"]]


def length_of(c: dict) -> int:
    return c["length"] if c["length"] is not None else len(ADDRESSES[c["address"]])


def line_of(c: dict) -> str:
    memory = memory_of(c)
    slots = " ".join(f"slot={'busy:' if busy else ''}{kind}:{dev}:{kind_of_handle}:{handle.hex()}"
                     for kind, dev, kind_of_handle, handle, busy in c["slots"])
    return (f"nr={c['nr']} arch={c['arch']} pid={c['pid']} tid={c['tid']} arg0={c['arg0']} "
            f"arg2={length_of(c) & 0xFFFFFFFFFFFFFFFF} thread={c['thread']} threads={c['threads']} "
            f"fd={c['fd']} domain={c['domain']} cookie={c['cookie']} sandbox={c['sandbox']} "
            f"nb={c['nb']} valid={c['valid']} memory={'unmapped' if memory is None else memory.hex()} "
            f"target_errno={c['target_errno']} target_sock={c['target_sock']} dev={c['dev']} "
            f"ino={c['ino']} handle_errno={c['handle_errno']} handle_type={c['handle_type']} "
            f"handle={c['handle'].hex()} listened={','.join(map(str, c['listened'])) or '-1'} {slots}")


def call_of(c: dict) -> cj.Call:
    """The same world as the Python path reads it."""
    gone = not c["thread"] or c["tid"] != c["pid"]
    length = cj.int32(length_of(c))
    memory = memory_of(c)
    raw_error = 0
    raw = b""
    if length > 0:
        if gone:
            raw_error = errno.ESRCH
        elif memory is None or length > len(memory):
            raw_error = errno.EFAULT
        else:
            raw = memory[:length]
    handle = None if c["handle_errno"] else (c["handle_type"], c["handle"])
    return cj.Call(
        nr=c["nr"], arch=c["arch"], pid=c["pid"], alone=not gone and c["threads"] == 1,
        sock_error=errno.ESRCH if gone else (0 if cj.int32(c["arg0"]) == c["fd"] else errno.EBADF),
        length=length, raw_error=raw_error, raw=raw, domain=c["domain"] or None,
        made_inside=c["cookie"] == c["sandbox"],
        target=cj.ConnectTarget(error=c["target_errno"], socket=bool(c["target_sock"]),
                         key=cj.identity_key(c["dev"], c["ino"], handle, c["fs_type"])))


def sandbox_of(c: dict) -> cj.Sandbox:
    listened = bytearray(8192)
    for port in c["listened"]:
        listened[port >> 3] |= 1 << (port & 7)
    # A slot being rewritten (odd sequence number) holds no record the
    # Python path has: it is being added or dropped.
    bound = {("handle", dev, kind_of_handle, handle)
             for kind, dev, kind_of_handle, handle, busy in c["slots"] if kind == 1 and not busy}
    named = {("handle", dev, kind_of_handle, handle): "named"
             for kind, dev, kind_of_handle, handle, busy in c["slots"] if kind == 2 and not busy}
    return cj.Sandbox(listened, bound, named)


def disagreement(c: dict, compiled: str) -> str | None:
    """None when the compiled path's answer is one the Python path would give."""
    if "VIOLATION" in compiled:
        return compiled
    verdict = cj.decide(call_of(c), sandbox_of(c))
    if compiled == "TO_PYTHON":
        return None
    if compiled == "GO_ON":
        return None if verdict.action == cj.GO_ON else f"GO_ON where the judge says {verdict}"
    if compiled == "GONE":
        return None if verdict.action in (cj.CONNECT, cj.CONNECT_TARGET) else \
            f"GONE where the judge says {verdict}"
    if compiled == "TARGET":
        return None if verdict == cj.ConnectAnswer(cj.CONNECT_TARGET) else \
            f"a connect through the target where the judge says {verdict}"
    if compiled.startswith("CONNECTED "):
        made = bytes.fromhex(compiled.split()[1])
        if verdict.action == cj.CONNECT and made == call_of(c).raw:
            return None
        return f"a connect to {made.hex()} where the judge says {verdict}"
    return f"an answer the harness does not know: {compiled}"


# ---------------------------------------------------------------- the cases

SLOTS = {
    "none": (),
    "bound-it": ((1, 2049, 1, HANDLE_A, False),),
    # Another file with the same inode number (5) on the same device: a
    # tmpfs whose counter wrapped. Its generation differs.
    "bound-same-inode-other-file": ((1, 2049, 1, HANDLE_B, False),),
    "bound-other-device": ((1, 2050, 1, HANDLE_A, False),),
    "named-it": ((2, 2049, 1, HANDLE_A, False),),
    "bound-it-being-rewritten": ((1, 2049, 1, HANDLE_A, True),),
    "bound-several": ((1, 2049, 1, HANDLE_B, False), (1, 2049, 1, HANDLE_A, False)),
}
DIMENSIONS = {
    "nr": [cj.SYS_CONNECT] * 6 + [cj.SYS_LISTEN, 49, 0, cj.SYS_CONNECT | 0x40000000],
    "arch": [X86_64] * 8 + [I386, AARCH64],
    "pid": [TID] * 8 + [0, 0xFFFFFFFF],
    # The world's thread: the notified one, or one whose TID reads as 0 (a
    # task the supervisor's PID namespace cannot name), or another.
    "tid": [TID] * 8 + [0, 77],
    "thread": [1] * 5 + [0],
    "threads": [1, 1, 2, 5],
    "arg0": [3, 3, 3, 4, 3 + (1 << 32)],
    "domain": [socket.AF_INET, socket.AF_INET6, socket.AF_UNIX, socket.AF_UNIX, 16, 0],
    "cookie": [SANDBOX, SANDBOX, OUTSIDE],
    "nb": [0, 1, 1],
    "valid": [1, 1, 1, 0],
    "address": list(ADDRESSES),
    "length": [None] * 8 + [0, 1, 2, 3, 129, -1],
    "memory": [None] * 8 + ["unmapped", b"\x02\x00"],
    "target_errno": [0] * 6 + [errno.ENOENT, errno.EXDEV, errno.EACCES],
    "target_sock": [1, 1, 1, 0],
    "handle_errno": [0] * 5 + [errno.EOPNOTSUPP],
    "fs_type": [TMPFS, 0xEF53],
    "slots": list(SLOTS),
}


def random_cases(count: int, seed: int):
    rng = random.Random(seed)
    for _ in range(count):
        c = case(**{name: rng.choice(values) for name, values in DIMENSIONS.items()})
        c["slots"] = SLOTS[c["slots"]]
        yield c


def table_cases():
    """Every address with every socket and every recorded table, the rest
    plain; then each single change from a plain connect; then random ones."""
    for address, domain, slots, cookie, nb, threads in itertools.product(
            ADDRESSES, DIMENSIONS["domain"][:5], SLOTS, (SANDBOX, OUTSIDE), (0, 1), (1, 2)):
        yield case(address=address, domain=domain, slots=SLOTS[slots], cookie=cookie, nb=nb,
                   threads=threads)
    for name, values in DIMENSIONS.items():
        for value in values:
            for address in ("v4-other", "unix-path"):
                given = {"address": address, "threads": 2, "slots": "bound-it",
                         "domain": socket.AF_UNIX if address == "unix-path" else 2, name: value}
                c = case(**given)
                c["slots"] = SLOTS[given["slots"]]
                yield c
    for address, domain in (("v4-other", socket.AF_INET), ("unix-path", socket.AF_UNIX)):
        for pid in (0, 0xFFFFFFFF, 0x80000000):
            yield case(pid=pid, tid=pid, address=address, domain=domain, slots=SLOTS["bound-it"])
    yield from random_cases(3000, seed=47)


TABLE = list(table_cases())


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    d = Driver(build(tmp_path_factory.mktemp("fast_continue")))
    yield d
    d.close()


def wrong_answers(driver: Driver, cases) -> list[str]:
    wrong = []
    for c in cases:
        problem = disagreement(c, driver.ask(c))
        if problem:
            wrong.append(f"{problem}\n    in {line_of(c)}")
    return wrong


def test_the_compiled_path_answers_only_as_the_judge_would(driver):
    wrong = wrong_answers(driver, TABLE)
    assert not wrong, f"{len(wrong)} of {len(TABLE)}:\n" + "\n".join(wrong[:10])


def test_the_table_reaches_every_answer_of_the_compiled_path(driver):
    """The harness can fail: the cases reach each of the compiled path's
    answers, not only TO_PYTHON."""
    seen = {driver.ask(c).split()[0] for c in TABLE}
    assert seen >= {"TO_PYTHON", "GO_ON", "CONNECTED", "TARGET", "GONE"}, seen


def verdict_kind(verdict: cj.ConnectAnswer) -> str:
    """A judge's answer by kind: its action, with a refusal's reason, an
    errno's name, and whether a connect through the target names a policy
    entry."""
    if verdict == cj.NOT_OURS:
        return "not-ours"
    if verdict.action == cj.REFUSE:
        return f"refuse: {verdict.why}"
    if verdict.action == cj.ERRNO:
        return f"errno: {errno.errorcode[verdict.errno]}"
    if verdict.action == cj.CONNECT_TARGET:
        return "connect-target: named" if verdict.why else "connect-target: bound"
    return verdict.action


EVERY_VERDICT_KIND = {
    "not-ours", cj.LISTEN, cj.GO_ON, cj.CONNECT, "connect-target: bound", "connect-target: named",
    *(f"refuse: {why}" for why in (cj.OUTSIDE_PATH, cj.THROUGH_PROC, cj.ABSTRACT_OUTSIDE,
                                   cj.MADE_OUTSIDE, cj.NO_IDENTITY)),
    *(f"errno: {name}" for name in ("EBADF", "ESRCH", "EINVAL", "EFAULT", "ENOTSOCK", "ENOENT",
                                    "EACCES", "ECONNREFUSED")),
}


def test_the_table_reaches_every_kind_of_the_judges_answer(driver):
    """Every kind of answer the judge gives (each action, each refusal's
    reason, each errno it passes on, a connect to a bound and to a named
    socket) is among the table's verdicts, each also put to the compiled
    path (which hands most of them to Python: TO_PYTHON). A verdict kind no
    case reaches would be one the two paths were never compared on."""
    kinds: dict[str, int] = {}
    pairs: dict[tuple[str, str], int] = {}
    for c in TABLE:
        kind = verdict_kind(cj.decide(call_of(c), sandbox_of(c)))
        kinds[kind] = kinds.get(kind, 0) + 1
        pair = (kind, driver.ask(c).split()[0])
        pairs[pair] = pairs.get(pair, 0) + 1
    print(f"{len(TABLE)} cases; the judge's answers by kind: {dict(sorted(kinds.items()))}")
    print("(judge, compiled) pairs: " + ", ".join(f"{k}/{a}: {n}" for (k, a), n in sorted(pairs.items())))
    assert set(kinds) >= EVERY_VERDICT_KIND, EVERY_VERDICT_KIND - set(kinds)
    # Each of the compiled path's own answers is met where the judge gives
    # the same: "continue" for its GO_ON, a connect for its CONNECT, a
    # connect through the checked fd for a bound socket's CONNECT_TARGET.
    assert {(cj.GO_ON, "GO_ON"), (cj.CONNECT, "CONNECTED"),
            ("connect-target: bound", "TARGET")} <= set(pairs), sorted(pairs)


def _world():
    return hs.fixed_dictionaries({
        name: hs.sampled_from(values) for name, values in DIMENSIONS.items()
    }).map(lambda given: {**case(**{k: v for k, v in given.items() if k != "slots"}),
                          "slots": SLOTS[given["slots"]]})


@settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))
@given(c=_world(), memory=hs.one_of(hs.none(), hs.binary(min_size=0, max_size=140)),
       listened=hs.lists(hs.sampled_from([8080, 9, 443, 0, 65535]), max_size=3))
def test_hypothesis_finds_no_answer_the_judge_would_not_give(driver, c, memory, listened):
    c = {**c, "listened": tuple(listened)}
    if memory is not None:
        c = {**c, "memory": memory, "length": len(memory)}
    problem = disagreement(c, driver.ask(c))
    assert problem is None, f"{problem}\n    in {line_of(c)}"


# ---------------------------------------------------------------- planted bugs
# Each: a check taken out of a copy of fast_continue.c. The first four are
# main's code before issue 47.
PLANTED = {
    "no-netns-cookie": ("    if (cookie_of(sock) != names->cookie)\n        return 0;\n", ""),
    "no-call-or-arch-check": (
        "n->data.nr != __NR_connect || n->data.arch != AUDIT_ARCH_X86_64 || (int32_t)n->pid <= 0",
        "(int32_t)n->pid <= 0"),
    "free-slot-matches-tid-0": (
        "    if (tid <= 0)\n        return NULL;\n    for (int i = 0; i < KEPT; i++)\n"
        "        if (kept[i].tid == tid)", "    for (int i = 0; i < KEPT; i++)\n"
        "        if (kept[i].tid == tid)"),
    "dotdot-proc-not-skipped": (
        "        else if (first[0] == '.' && first[1] == '.' && (first[2] == '/' || first[2] == 0))\n"
        "            first += 2;\n", ""),
    "identity-by-device-alone": ("memcmp(copy.handle, fh->f_handle, fh->handle_bytes) == 0", "1"),
    "loopback-port-not-checked": ("return port < 0 || (names->listened[port >> 3] >> (port & 7) & 1);",
                                  "return 1;"),
    "busy-slot-taken": ("        if (before & 1)\n            continue;\n", ""),
}


@pytest.mark.parametrize("bug", list(PLANTED))
def test_a_planted_bug_is_caught(tmp_path, bug):
    old, new = PLANTED[bug]
    if bug == "free-slot-matches-tid-0":
        # With the TID check of decide() taken out too, as main had neither.
        source = SOURCE.read_text().replace(" || (int32_t)n->pid <= 0", "")
    else:
        source = SOURCE.read_text()
    assert old in source, f"the planted bug {bug} no longer applies to fast_continue.c"
    planted = Driver(build(tmp_path, source.replace(old, new), sanitize=False))
    try:
        wrong = wrong_answers(planted, TABLE)
    finally:
        planted.close()
    assert wrong, f"the harness did not catch the planted bug {bug}"


# ---------------------------------------------------------------- the findings, judged

def test_two_files_that_share_an_inode_number_are_told_apart():
    """Issue 47, 1: a tmpfs whose inode counter wrapped gives a file outside
    the number of one the program bound. Main's judge matched (st_dev,
    st_ino) against sock_diag's listeners and let it through."""
    mine = cj.identity_key(2049, 5, (1, HANDLE_A), TMPFS)
    outside = cj.identity_key(2049, 5, (1, HANDLE_B), TMPFS)
    view = cj.Sandbox(bytearray(8192), {mine}, {})
    at = cj.Call(domain=socket.AF_UNIX, length=13, raw=sockaddr_un(b"/tmp/s.sock"),
                 target=cj.ConnectTarget(socket=True, key=outside))
    assert cj.decide(at, view) == cj.ConnectAnswer(cj.REFUSE, errno.EPERM, cj.OUTSIDE_PATH)
    # control: the file the program bound itself is reached
    assert cj.decide(at._replace(target=cj.ConnectTarget(socket=True, key=mine)), view) == \
        cj.ConnectAnswer(cj.CONNECT_TARGET)


def test_without_a_handle_a_file_system_whose_numbers_repeat_gives_no_identity():
    assert cj.identity_key(2049, 5, None, TMPFS) is None
    assert cj.identity_key(2049, 5, None, 0xEF53) == ("inode", 2049, 5)     # ext4's cannot repeat
    view = cj.Sandbox(bytearray(8192), set(), {})
    at = cj.Call(domain=socket.AF_UNIX, length=13, raw=sockaddr_un(b"/tmp/s.sock"),
                 target=cj.ConnectTarget(socket=True, key=None))
    assert cj.decide(at, view) == cj.ConnectAnswer(cj.REFUSE, errno.EPERM, cj.NO_IDENTITY)


@pytest.mark.parametrize("family", [socket.AF_INET, socket.AF_INET6, 16])
def test_a_socket_made_outside_is_refused(family):
    """Issue 47, 2: an IP (or netlink) socket made outside, passed in."""
    view = cj.Sandbox(bytearray(8192), set(), {})
    at = cj.Call(alone=True, domain=family, length=16, raw=ADDRESSES["v4-other"], made_inside=False)
    assert cj.decide(at, view) == cj.ConnectAnswer(cj.REFUSE, errno.EPERM, cj.MADE_OUTSIDE)
    assert cj.decide(at._replace(made_inside=True), view).action in (cj.GO_ON, cj.CONNECT)   # control


@pytest.mark.parametrize("nr,arch,pid", [(cj.SYS_CONNECT, I386, TID), (cj.SYS_CONNECT | 0x40000000, X86_64, TID),
                                         (49, X86_64, TID), (cj.SYS_CONNECT, X86_64, 0),
                                         (cj.SYS_CONNECT, X86_64, 0xFFFFFFFF)])
def test_a_call_arch_or_thread_the_filter_never_sends_is_refused(nr, arch, pid):
    """Issue 47, 3 and 4."""
    view = cj.Sandbox(bytearray(8192), set(), {})
    at = cj.Call(nr=nr, arch=arch, pid=pid, alone=True, domain=2, length=16,
                 raw=ADDRESSES["v4-other"], made_inside=True)
    assert cj.decide(at, view) == cj.NOT_OURS
    assert cj.decide(at._replace(nr=cj.SYS_CONNECT, arch=X86_64, pid=TID), view).action == cj.GO_ON


def test_a_refused_loopback_port_once_listened_on_is_reported_by_neither_path():
    """Issue 47, 5: the compiled path lets such a connect go on (or makes
    it) and reports nothing; the Python path now reports none either."""
    listened = bytearray(8192)
    listened[8080 >> 3] |= 1 << (8080 & 7)
    assert not cj.reports_refusal(8080, listened)
    assert cj.reports_refusal(9, listened)
