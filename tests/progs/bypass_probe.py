"""One way out per attempt: `bypass_probe.py PLAN.json` runs every attempt of
the plan, each in a forked child of its own, and prints one JSON line each:

    {"id": ..., "ok": true|false, "errno": "EPERM"|null, "detail": "..."}

`ok` means the attempt did what it set out to do (a connection made, a
namespace joined, a signal delivered). `errno` names what refused it: an
errno name, GAIERROR for a failed look-up, HTTP_<status> or SOCKS_<code> for a
door's answer, EXIT_<n> for a command, ETIMEDOUT when nothing answered.

The plan is a JSON list of {"id", "attempt", "args"}. Standard library only,
run with Debian's /usr/bin/python3, as any user, inside the sandbox and out.
"""
import ctypes
import errno
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NR = {"socket": 41, "socketpair": 53, "clone": 56, "ptrace": 101, "setns": 308, "unshare": 272, "prlimit64": 302,
      "pidfd_send_signal": 424, "io_uring_setup": 425, "io_uring_enter": 426,
      "io_uring_register": 427, "pidfd_open": 434, "clone3": 435, "pidfd_getfd": 438,
      "keyctl": 250, "add_key": 248, "chroot": 161, "mount": 165, "name_to_handle_at": 303,
      "open_by_handle_at": 304, "bpf": 321, "getpid": 39}
X32 = 0x40000000
CLONE_NEWUSER, CLONE_NEWNET, CLONE_NEWNS, CLONE_NEWPID = 0x10000000, 0x40000000, 0x20000, 0x20000000
TIMEOUT = 8


class Refused(Exception):
    """A refusal that is not an errno: a door's answer, a command's exit code."""

    def __init__(self, name, detail=""):
        super().__init__(name)
        self.name, self.detail = name, detail


def sys_call(nr, *args):
    res = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    if res == -1:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return res


# ------------------------------------------------------------ direct traffic

def tcp(host, port):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(TIMEOUT)
        s.connect((host, int(port)))
        return f"connected to {host}:{port}"


def tcp_banner(host, port):
    """Connect and read the one line the listener sends first."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(TIMEOUT)
        s.connect((host, int(port)))
        return s.makefile("rb").readline().decode(errors="replace").strip()


def tcp_ask(host, port):
    """Connect (a name through the resolver), send an HTTP request and read
    the answer's first line: a banner or a status line. vpnw's own 403 is a
    refusal (HTTP_403_VPNW, its body the detail); a reset is ECONNRESET."""
    with socket.create_connection((host, int(port)), timeout=TIMEOUT) as s:
        s.sendall(b"GET /whoami HTTP/1.0\r\nHost: " + host.encode() + b"\r\n\r\n")
        data = b""
        while b"\n" not in data or (data.startswith(b"HTTP/") and b"\r\n\r\n" not in data):
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
        if data.startswith(b"HTTP/1.1 403") and b"vpnw" in data.lower():
            raise Refused("HTTP_403_VPNW", data.split(b"\r\n\r\n", 1)[-1].decode(errors="replace"))
        if not data:
            raise Refused("EOF")
        return data.split(b"\n")[0].decode(errors="replace").strip()


def tls_handshake(host, port):
    """A TLS handshake (the certificate not checked: the control's server is
    the world's). vpnw's refusal is the alert access_denied, in the clear."""
    import ssl
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with socket.create_connection((host, int(port)), timeout=TIMEOUT) as raw:
        try:
            with context.wrap_socket(raw, server_hostname=host) as tls:
                return f"handshake done ({tls.version()})"
        except ssl.SSLError as e:
            if "ALERT_ACCESS_DENIED" in str(e) or "alert access denied" in str(e):
                raise Refused("TLS_ALERT_ACCESS_DENIED", str(e))
            raise


def _dns_query(name):
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    return struct.pack("!HHHHHH", 0x7670, 0x0100, 1, 0, 0, 0) + labels + struct.pack("!HH", 1, 1)


def udp(host, port, kind="echo"):
    """Send one datagram and wait for any answer (unconnected: the answer may
    come from another source address of the same host)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    payload = _dns_query("api.github.com") if kind == "dns" else b"vpnw-bypass"
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.settimeout(TIMEOUT)
        s.sendto(payload, (host, int(port)))
        try:
            data, peer = s.recvfrom(4096)
        except socket.timeout:
            raise OSError(errno.ETIMEDOUT, "no answer")
        return f"{len(data)} bytes back from {peer[0]}"


def lookup(name):
    return str(socket.getaddrinfo(name, 443)[0][4])


def _icmp_echo(family, sock_type, proto, host):
    with socket.socket(family, sock_type, proto) as s:
        s.settimeout(TIMEOUT)
        kind = 8 if family == socket.AF_INET else 128
        body = struct.pack("!BBHHH", kind, 0, 0, 0x7670, 1) + b"vpnw-bypass"
        if family == socket.AF_INET:  # the kernel fills the checksum for ICMPv6
            padded = body + b"\0" * (len(body) % 2)
            total = sum(struct.unpack(f"!{len(padded) // 2}H", padded))
            total = (total >> 16) + (total & 0xFFFF)
            total += total >> 16
            body = body[:2] + struct.pack("!H", ~total & 0xFFFF) + body[4:]
        s.sendto(body, (host, 0))
        while True:
            try:
                data = s.recv(4096)
            except socket.timeout:
                raise OSError(errno.ETIMEDOUT, "no echo reply")
            if sock_type == socket.SOCK_RAW and family == socket.AF_INET:
                data = data[(data[0] & 0xF) * 4:]
            if data and data[0] in (0, 129):
                return f"echo reply from {host}"


def raw_icmp(host):
    if ":" in host:
        return _icmp_echo(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6, host)
    return _icmp_echo(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP, host)


def ping_socket(host):
    if ":" in host:
        return _icmp_echo(socket.AF_INET6, socket.SOCK_DGRAM, socket.IPPROTO_ICMPV6, host)
    return _icmp_echo(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP, host)


def packet_socket():
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003)):
        return "AF_PACKET socket created"


# ------------------------------------------------------------ netlink

def _attr(kind, data):
    ln = 4 + len(data)
    return struct.pack("=HH", ln, kind) + data + b"\0" * ((-ln) % 4)


def _netlink(msg_type, flags, body):
    hdr = struct.pack("=IHHII", 16 + len(body), msg_type, 0x1 | 0x4 | flags, 1, 0)  # REQUEST|ACK
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0) as s:
        s.settimeout(TIMEOUT)
        s.send(hdr + body)
        reply = s.recv(65536)
    code = struct.unpack_from("=i", reply, 16)[0]
    if code:
        raise OSError(-code, os.strerror(-code))


def _ifinfo(index=0, flags=0, change=0):
    return struct.pack("=BxHiII", 0, 0, index, flags, change)


def _lo_up():
    # A scratch namespace (the control) starts with lo down; the sandbox's is
    # up already, and there the request is refused like the route after it.
    try:
        _netlink(16, 0, _ifinfo(1, 1, 1))
    except OSError:
        pass


def netlink_addr():
    body = struct.pack("=BBBBI", socket.AF_INET, 32, 0, 0, 1)
    addr = socket.inet_aton("10.99.0.1")
    _netlink(20, 0x400 | 0x200, body + _attr(2, addr) + _attr(1, addr))  # RTM_NEWADDR
    return "10.99.0.1/32 added to lo"


def netlink_route():
    _lo_up()
    body = struct.pack("=BBBBBBBBI", socket.AF_INET, 24, 0, 0, 254, 3, 253, 1, 0)
    _netlink(24, 0x400 | 0x200, body + _attr(1, socket.inet_aton("10.99.0.0"))
             + _attr(4, struct.pack("=i", 1)))  # RTM_NEWROUTE dev lo
    return "route 10.99.0.0/24 dev lo added"


def _veth(name, peer, peer_ns_pid=None):
    peer_attrs = _attr(3, peer.encode() + b"\0")
    if peer_ns_pid is not None:
        peer_attrs += _attr(19, struct.pack("=I", peer_ns_pid))  # IFLA_NET_NS_PID
    linkinfo = _attr(1, b"veth\0") + _attr(2, _attr(1, _ifinfo() + peer_attrs))
    _netlink(16, 0x400 | 0x200, _ifinfo() + _attr(3, name.encode() + b"\0") + _attr(18, linkinfo))


def netlink_veth():
    _veth("vpnwv0", "vpnwv1")
    return "veth pair created"


def _netns_child():
    """A child in a new network namespace (possible only with CAP_SYS_ADMIN)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            sys_call(NR["unshare"], CLONE_NEWNET)
            os.write(w, b"y")
        except OSError:
            os.write(w, b"n")
        signal.pause()
        os._exit(0)
    ok = os.read(r, 1) == b"y"
    return pid if ok else None


def netlink_move_link(target_pid):
    """RTM_NEWLINK with IFLA_NET_NS_PID: a veth end moved into another
    namespace. Where no veth can be made, lo itself is asked to move."""
    child = None
    try:
        if target_pid == "child":
            child = _netns_child()
            target = child if child else os.getpid()
        else:
            target = int(target_pid)
        try:
            _veth("vpnwm0", "vpnwm1")
            index = socket.if_nametoindex("vpnwm1")
        except OSError:
            index = 1
        _netlink(16, 0, _ifinfo(index) + _attr(19, struct.pack("=I", target)))
        return f"link {index} moved to the network namespace of pid {target}"
    finally:
        if child:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)


def tun():
    import fcntl
    fd = os.open("/dev/net/tun", os.O_RDWR)
    try:
        ifr = struct.pack("16sH22x", b"vpnwtun0", 0x0001 | 0x1000)  # IFF_TUN | IFF_NO_PI
        fcntl.ioctl(fd, 0x400454CA, ifr)  # TUNSETIFF
        return "tun device vpnwtun0 created"
    finally:
        os.close(fd)


# ------------------------------------------------------------ namespaces

def unshare(flags):
    sys_call(NR["unshare"], int(flags, 0))
    return f"unshare({flags}) worked"


def clone_newuser():
    pid = sys_call(NR["clone"], CLONE_NEWUSER | signal.SIGCHLD, 0, 0, 0, 0)
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return "clone(CLONE_NEWUSER) made a child"


def clone3_newuser():
    args = struct.pack("=QQQQQQQQ", CLONE_NEWUSER, 0, 0, 0, signal.SIGCHLD, 0, 0, 0)
    buf = ctypes.create_string_buffer(args, len(args))
    pid = sys_call(NR["clone3"], ctypes.addressof(buf), len(args))
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return "clone3(CLONE_NEWUSER) made a child"


def command(*argv):
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=20)
    if proc.returncode != 0:
        raise Refused(f"EXIT_{proc.returncode}", (proc.stderr or proc.stdout).strip()[-300:])
    return proc.stdout.strip()[-300:]


def _setns(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        sys_call(NR["setns"], fd, 0)
    finally:
        os.close(fd)


def setns_paths(*paths):
    """Join each namespace in turn (a user namespace first, then what it owns)."""
    for path in paths:
        _setns(path)
    return f"joined {' '.join(paths)}"


def setns_every_visible():
    """setns to every /proc/*/ns/* this process can see; ok if any works."""
    outcomes = {}
    for pid in sorted(p for p in os.listdir("/proc") if p.isdigit()):
        try:
            kinds = os.listdir(f"/proc/{pid}/ns")
        except OSError as e:
            outcomes[f"/proc/{pid}/ns"] = errno.errorcode[e.errno]
            continue
        for kind in kinds:
            path = f"/proc/{pid}/ns/{kind}"
            try:
                _setns(path)
                return f"joined {path}"
            except OSError as e:
                outcomes[path] = errno.errorcode[e.errno]
    names = sorted(set(outcomes.values()))
    raise Refused(",".join(names), json.dumps(outcomes))


# ------------------------------------------------------------ processes

def _ancestors():
    chain, pid = set(), os.getpid()
    while pid > 0:
        chain.add(pid)
        try:
            pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            break
    return chain


def visible_processes():
    """ok if /proc shows any process but this one, its ancestors and init."""
    mine = _ancestors() | {1}
    others = [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in mine]
    if others:
        return f"other processes visible: {sorted(others, key=int)[:20]}"
    raise Refused("NONE_VISIBLE", f"only init and this process's own line: {sorted(mine)}")


def proc_file(pid, what):
    path = f"/proc/{pid}/{what}"
    if what in ("environ", "mem"):
        fd = os.open(path, os.O_RDONLY)
        try:
            if what == "environ":
                return f"{len(os.read(fd, 65536))} bytes of environment"
            return "opened the memory of the process"
        finally:
            os.close(fd)
    if what == "root":
        return f"{len(os.listdir(path))} entries in its root"
    # Seeing the numbers is not enough: ok only if a descriptor can be opened.
    numbers = os.listdir(path)
    refused = {}
    for n in numbers:
        try:
            os.close(os.open(f"{path}/{n}", os.O_RDONLY | os.O_NONBLOCK))
            return f"opened descriptor {n} of {pid} (of {numbers})"
        except OSError as e:
            refused[n] = errno.errorcode[e.errno]
    raise Refused(",".join(sorted(set(refused.values()))) or "NO_DESCRIPTORS", json.dumps(refused))


def signal_process(pid, sig):
    os.kill(int(pid), int(sig))
    return f"signal {sig} delivered to {pid}"


def pidfd_signal(pid, sig):
    fd = sys_call(NR["pidfd_open"], int(pid), 0)
    try:
        sys_call(NR["pidfd_send_signal"], fd, int(sig), 0, 0)
        return f"signal {sig} delivered through a pidfd"
    finally:
        os.close(fd)


def pidfd_getfd(pid, target_fd):
    fd = sys_call(NR["pidfd_open"], int(pid), 0)
    try:
        got = sys_call(NR["pidfd_getfd"], fd, int(target_fd), 0)
        os.close(got)
        return f"took descriptor {target_fd} of {pid}"
    finally:
        os.close(fd)


def prlimit(pid):
    old = (ctypes.c_uint64 * 2)()
    sys_call(NR["prlimit64"], int(pid), 7, 0, ctypes.addressof(old))  # RLIMIT_NOFILE, read only
    return f"read the file limit of {pid}: {old[0]}"


def setpriority(pid):
    now = os.getpriority(os.PRIO_PROCESS, int(pid))
    os.setpriority(os.PRIO_PROCESS, int(pid), now)
    return f"set the priority of {pid}"


def ptrace_seize(pid):
    sys_call(NR["ptrace"], 0x4206, int(pid), 0, 0)  # PTRACE_SEIZE; detached when we exit
    return f"seized {pid}"


def ptrace_every_visible():
    """Seize every visible process outside this process's own line (init
    included); ok if any can be seized."""
    outcomes = {}
    own = _ancestors() - {1}
    for p in sorted(p for p in os.listdir("/proc") if p.isdigit() and int(p) not in own):
        try:
            sys_call(NR["ptrace"], 0x4206, int(p), 0, 0)
            return f"seized {p}"
        except OSError as e:
            outcomes[p] = errno.errorcode[e.errno]
    raise Refused(",".join(sorted(set(outcomes.values()))) or "NONE_VISIBLE", json.dumps(outcomes))


# ------------------------------------------------------------ IPC and keys

def sysv(kind, key):
    get = {"shm": libc.shmget, "msg": libc.msgget, "sem": libc.semget}[kind]
    args = {"shm": (int(key, 0), 0, 0), "msg": (int(key, 0), 0), "sem": (int(key, 0), 0, 0)}[kind]
    res = get(*[ctypes.c_long(a) if i == 0 else a for i, a in enumerate(args)])
    if res == -1:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return f"{kind} {key} found: id {res}"


def keyctl_session():
    kid = sys_call(NR["keyctl"], 0, -3 & 0xFFFFFFFFFFFFFFFF, 1)  # GET_KEYRING_ID(session, create)
    return f"session keyring {kid}"


def add_key_process():
    kid = sys_call(NR["add_key"], ctypes.c_char_p(b"user"), ctypes.c_char_p(b"vpnw-bypass"),
                   ctypes.c_char_p(b"x"), 1, -2 & 0xFFFFFFFFFFFFFFFF)  # the process keyring
    return f"key {kid} added"


# ------------------------------------------------------------ Unix sockets

def unix_connect(name):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(TIMEOUT)
        s.connect("\0" + name[1:] if name.startswith("@") else name)
        return s.makefile("rb").readline().decode(errors="replace").strip() or "connected"


def socketpair(kind):
    a, b = _pair(kind)
    a.close()
    b.close()
    return f"{kind} socketpair made"


# A pair's kind: its type, plus "+flags" for SOCK_CLOEXEC|SOCK_NONBLOCK and
# "+high" for AF_UNIX with bits above the 32 the kernel reads. "raw" is
# AF_UNIX's alias for datagram.
PAIR_TYPES = {"stream": socket.SOCK_STREAM, "dgram": socket.SOCK_DGRAM, "raw": socket.SOCK_RAW,
              "seqpacket": socket.SOCK_SEQPACKET}


def _pair(kind):
    base, *extra = kind.split("+")
    family = socket.AF_UNIX | (1 << 32 if "high" in extra else 0)
    sock_type = PAIR_TYPES[base] | (socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK if "flags" in extra else 0)
    sv = (ctypes.c_int * 2)()
    sys_call(NR["socketpair"], family, sock_type, 0, ctypes.addressof(sv))
    a, b = (socket.socket(fileno=fd) for fd in sv)
    a.setblocking(True)
    b.setblocking(True)
    return a, b


def _unix_address(name):
    return "\0" + name[1:] if name.startswith("@") else name


def _token():
    return "m" + os.urandom(8).hex()


def _delivered(peer, token, received):
    """Where did the one message go? A message goes to exactly one socket: if
    the pair's other end holds it, the kernel ignored the address and it went
    nowhere else. Otherwise the target outside logs it under its token."""
    if peer is not None:
        try:
            data = peer.recv(65536, socket.MSG_DONTWAIT)
        except BlockingIOError:
            data = b""
        if token.encode() in data:
            raise Refused("TO_PEER", "the kernel ignored the address: the pair's other end got it")
    proof = os.path.join(received, token)
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        if os.path.exists(proof):
            with open(proof) as f:
                return f"the target outside got it ({f.read().strip()})"
        time.sleep(0.01)
    raise OSError(errno.ETIMEDOUT, "neither the pair's other end nor the target got it")


def pair_sendto(kind, target, received):
    """sendto() on a pair's end with a destination: a datagram socket's way
    to reach journald, syslog or a notify socket."""
    a, b = _pair(kind)
    token = _token()
    a.sendto(token.encode(), _unix_address(target))
    return _delivered(b, token, received)


def pair_connect(kind, target, received, peer="open"):
    """connect() a pair's end elsewhere (after its other end closed, with
    peer="closed"), then send on it: ok if the target outside gets it."""
    a, b = _pair(kind)
    if peer == "closed":
        b.close()
        b = None
    a.connect(_unix_address(target))
    token = _token()
    a.send(token.encode())
    return _delivered(b, token, received)


def pair_connect_listener(kind, target):
    """connect() a pair's end to a listening socket: ok if the listener answers."""
    a, _b = _pair(kind)
    a.settimeout(TIMEOUT)
    a.connect(_unix_address(target))
    return a.recv(4096).decode(errors="replace").strip() or "connected"


def socket_connect_listener(kind, target):
    """The same with a socket of its own (what the pair must not stand in for)."""
    with socket.socket(socket.AF_UNIX, PAIR_TYPES[kind]) as s:
        s.settimeout(TIMEOUT)
        s.connect(_unix_address(target))
        return s.recv(4096).decode(errors="replace").strip() or "connected"


def pair_scm_rights(kind, target, received):
    """sendmsg() with a destination and the pair's other end as SCM_RIGHTS:
    a descriptor handed to a service outside."""
    a, b = _pair(kind)
    token = _token()
    a.sendmsg([token.encode()], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", b.fileno()))],
              0, _unix_address(target))
    return _delivered(b, token, received)


def passed_pair_sendto(kind, target, received):
    """A pair's end passed over SCM_RIGHTS (as to a child) keeps what it is:
    sendto() with a destination on the received descriptor."""
    a, b = _pair(kind)
    c, d = _pair("stream")
    socket.send_fds(c, [b"end"], [a.fileno()])
    _msg, fds, _flags, _addr = socket.recv_fds(d, 16, 1)
    a.close()
    moved = socket.socket(fileno=fds[0])
    token = _token()
    moved.sendto(token.encode(), _unix_address(target))
    return _delivered(b, token, received)


def pair_listen(kind, where):
    """bind() a pair's end to a new path (or abstract name) and listen() on
    it: ok if it becomes a listener others could connect to."""
    import shutil
    import tempfile
    a, _b = _pair(kind)
    where_dir = tempfile.mkdtemp(prefix="vpnw-bypass-")
    try:
        a.bind("\0" + _token() if where == "abstract" else os.path.join(where_dir, "pair.sock"))
        a.listen(1)
        return f"listening on {a.getsockname()!r}"
    finally:
        shutil.rmtree(where_dir)


def pair_roundtrip(kind):
    """A pair used as programs use one: a child sends a message and a
    descriptor back over it; ok when both arrive."""
    a, b = _pair(kind)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        a.close()
        socket.send_fds(b, [b"hello from the child"], [w])
        os._exit(0)
    b.close()
    os.close(w)
    msg, fds, _flags, _addr = socket.recv_fds(a, 64, 1)
    os.waitpid(pid, 0)
    for fd in fds:
        os.close(fd)
    os.close(r)
    if msg != b"hello from the child" or len(fds) != 1:
        raise Refused("BROKEN", f"got {msg!r} and {len(fds)} descriptors")
    return f"{kind} pair carried a message and a descriptor"


# ------------------------------------------------------------ Unix sockets by origin
# (issue 26: the supervisor connects only to sockets bound inside the sandbox)

INSIDE_BANNER = b"inside\n"


def _listener(path_or_name, kind=socket.SOCK_STREAM):
    """A listener of this process tree that answers every connection with
    INSIDE_BANNER, from a forked child; returns that child's PID."""
    s = socket.socket(socket.AF_UNIX, kind)
    s.bind(path_or_name)
    s.listen(64)
    pid = os.fork()
    if pid == 0:
        while True:
            c, _ = s.accept()
            c.send(INSIDE_BANNER)
            c.close()
    s.close()
    return pid


def _banner(s):
    s.settimeout(TIMEOUT)
    data = s.recv(4096)
    return data.decode(errors="replace").strip() or "connected"


def unix_reach(how, target, mode="blocking"):
    """connect() to `target` (a path outside) another way: through a symlink,
    /proc/self/root (named, or behind a symlink), /proc/<pid>/cwd, a relative
    path, or a hard link made beside it; from a non-blocking socket (as Node, Go
    and tokio connect) when `mode` says so."""
    scratch = _scratch()
    name = {"symlink": lambda: _link(os.symlink, target, scratch),
            # Beside the target: a hard link cannot cross a mount, and each
            # directory above vpnw's protected paths is a mount of its own
            # (pins: docs/architecture.md), so one made in /tmp ends EXDEV
            # before the connect it is meant to try.
            "hardlink": lambda: _link(os.link, target, os.path.dirname(target),
                                      f"link-{_token()}.sock"),
            "proc-self-root": lambda: "/proc/self/root" + target,
            "proc-self-symlink": lambda: _link(os.symlink, "/proc/self/root" + target, scratch),
            "proc-pid-cwd": lambda: (os.chdir(os.path.dirname(target)),
                                     f"/proc/{os.getpid()}/cwd/{os.path.basename(target)}")[1],
            "relative": lambda: (os.chdir(os.path.dirname(target)), os.path.basename(target))[1],
            }[how]()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.setblocking(mode != "nonblocking")
        s.connect(name)
        return _banner(s)


def unix_relink_before_listen(target, mode="blocking"):
    """Bind a socket of our own, rename its file away, hard-link `target` (a
    socket outside) at its name, then listen() and connect() to that name:
    a supervisor that took the listener's file by its path would take the
    target for ours."""
    # Beside the target, as unix_reach's hard link: each directory above
    # vpnw's protected paths is a mount of its own (pins), and a link across
    # a mount ends EXDEV before the listen() and connect() this tries.
    name = os.path.join(os.path.dirname(target), f"own-{_token()}.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as own:
        own.bind(name)
        os.rename(name, name + ".away")
        os.link(target, name)
        own.listen(4)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.setblocking(mode != "nonblocking")
            try:
                s.connect(name)
            except BlockingIOError:
                select.select([], [s], [], TIMEOUT)
                err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    raise OSError(err, os.strerror(err)) from None
            s.setblocking(True)
            return _banner(s)


def _scratch():
    import tempfile
    return tempfile.mkdtemp(prefix="vpnw-probe-")


def _link(make, target, scratch, base="link.sock"):
    name = os.path.join(scratch, base)
    make(target, name)
    return name


def unix_own(kind, where):
    """What programs do: a child listens on a socket of this tree (a path in
    a temp dir, a relative path, an abstract name) and the parent talks to it."""
    sock_type = {"stream": socket.SOCK_STREAM, "seqpacket": socket.SOCK_SEQPACKET}[kind]
    scratch = _scratch()
    os.chdir(scratch)
    name = {"path": os.path.join(scratch, "own.sock"), "relative": "own.sock",
            "abstract": "\0vpnw-own-" + _token(),
            "path-nonblocking": os.path.join(scratch, "own.sock")}[where]
    pid = _listener(name, sock_type)
    try:
        with socket.socket(socket.AF_UNIX, sock_type) as s:
            s.setblocking(where != "path-nonblocking")     # as Node, Go and tokio connect
            s.connect(name)
            got = _banner(s)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    if got != INSIDE_BANNER.decode().strip():
        raise Refused("BROKEN", f"the listener said {got!r}")
    return f"{kind} {where}: {got}"


def _race(target, flip, connect, rounds=1000):
    """`flip(i)` runs in a second thread while this one connects `rounds`
    times; ok as soon as one connection reaches anything but our own listener.
    The interpreter switches threads every 10 us here, not every 5 ms: with
    the default, the flipper ran only a few times in a whole race and the
    control outside sometimes never won it."""
    stop = threading.Event()
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)

    def flipper():
        i = 0
        while not stop.is_set():
            flip(i)
            i += 1
    t = threading.Thread(target=flipper, daemon=True)
    t.start()
    seen = {}
    try:
        for _ in range(rounds):
            try:
                got = connect()
            except OSError as e:
                got = errno.errorcode.get(e.errno, str(e.errno))
            seen[got] = seen.get(got, 0) + 1
            if got != "inside" and got not in errno.errorcode.values():
                return f"reached {got!r} ({seen})"
    finally:
        stop.set()
        t.join()
        sys.setswitchinterval(switch)
    raise Refused("NEVER_OUTSIDE", json.dumps(seen))


def unix_swap_memory(target):
    """The address changes in memory while connect() waits for the supervisor:
    a second thread flips the sockaddr between our own socket and `target`."""
    own = os.path.join(_scratch(), "own.sock")
    pid = _listener(own)
    size = 110
    addr = {k: struct.pack("=H", socket.AF_UNIX) + p.encode().ljust(size - 2, b"\0")
            for k, p in (("own", own), ("out", target))}
    buf = ctypes.create_string_buffer(addr["own"], size)

    def connect():
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            if libc.connect(s.fileno(), buf, size) != 0:
                e = ctypes.get_errno()
                raise OSError(e, os.strerror(e))
            return _banner(s)
    try:
        return _race(target, lambda i: ctypes.memmove(buf, addr["out" if i % 2 else "own"], size),
                     connect)
    finally:
        os.kill(pid, signal.SIGKILL)


def unix_swap_symlink(target):
    """A symlink that a second thread keeps pointing at our own socket and at `target`."""
    scratch = _scratch()
    own = os.path.join(scratch, "own.sock")
    pid = _listener(own)
    link = os.path.join(scratch, "link.sock")
    os.symlink(own, link)

    def flip(i):
        tmp = os.path.join(scratch, f"tmp{i % 2}")
        try:
            os.symlink(target if i % 2 else own, tmp)
            os.rename(tmp, link)
        except OSError:
            pass

    def connect():
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(link)
            return _banner(s)
    try:
        return _race(target, flip, connect)
    finally:
        os.kill(pid, signal.SIGKILL)


def unix_fd_swap(target):
    """One fd number, a second thread swapping a TCP socket and a Unix socket
    under it while connect(fd, target) waits: the connect the kernel would
    go on with after a "continue" meets the other socket."""
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    slot = os.dup(tcp.fileno())
    addr = struct.pack("=H", socket.AF_UNIX) + target.encode() + b"\0"

    def flip(i):
        os.dup2((unix if i % 2 else tcp).fileno(), slot)
        time.sleep(0.0001)

    def connect():
        time.sleep(0.0003)
        if libc.connect(slot, addr, len(addr)) != 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
        # The slot may hold the other socket again by now: ask the Unix one.
        try:
            return f"the Unix socket is connected to {unix.getpeername()!r}"
        except OSError:
            return "inside"
    return _race(target, flip, connect)


def unix_swap_and_leave(target, rounds=1000):
    """A thread alone in its group may be let go on ("continue") by the
    supervisor once its socket is seen to be TCP. Here, each round, a second
    thread puts a Unix socket under the TCP socket's fd number (dup2), writes
    `target`'s address over the inet one in memory, and exits, while the
    first connects: were the socket taken before the group was counted, the
    count could say "alone" after a swap the take did not see, and the
    kernel would connect the Unix socket to `target`."""
    import random
    own = socket.socket()
    own.bind(("127.0.0.1", 0))
    own.listen(4096)
    own.setblocking(False)
    size = 110
    inet = struct.pack("=H", socket.AF_INET) + struct.pack("!H", own.getsockname()[1]) \
        + socket.inet_aton("127.0.0.1")
    unix_addr = struct.pack("=H", socket.AF_UNIX) + target.encode() + b"\0"
    seen = {}
    for _ in range(rounds):
        tcp = socket.socket()
        unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        slot = tcp.fileno()
        buf = ctypes.create_string_buffer(inet.ljust(size, b"\0"), size)
        pause = random.random() * 3e-4

        def swap():
            time.sleep(pause)
            os.dup2(unix.fileno(), slot)
            ctypes.memmove(buf, unix_addr, len(unix_addr))
        t = threading.Thread(target=swap)
        t.start()
        time.sleep(random.random() * 3e-4)
        got = "inside" if libc.connect(slot, buf, size) == 0 else \
            errno.errorcode.get(ctypes.get_errno(), "?")
        t.join()
        try:
            got = f"the Unix socket is connected to {unix.getpeername()!r}"
        except OSError:
            pass
        seen[got] = seen.get(got, 0) + 1
        unix.close()
        tcp.close()
        while True:
            try:
                own.accept()[0].close()
            except BlockingIOError:
                break
        if got.startswith("the Unix socket"):
            return f"reached {got!r} ({seen})"
    raise Refused("NEVER_OUTSIDE", json.dumps(seen))


def unix_swap_many_threads(target, rounds=1000):
    """A program of many threads (as Node, Go and tokio are) connects a
    non-blocking TCP socket to a loopback listener of its own while two
    other threads keep swapping what the connect names: one puts a
    non-blocking Unix socket under the fd number (dup2) and the TCP one
    back, one writes `target`'s address over the inet one in memory and
    back. Such a thread is never let go on ("continue"): the supervisor
    connects the socket it took to the bytes it read, so the Unix socket
    never reaches `target`, whichever swap lands when. Outside, it does."""
    import random
    own = socket.socket()
    own.bind(("127.0.0.1", 0))
    own.listen(4096)
    own.setblocking(False)
    size = 110
    addr = [(struct.pack("=H", socket.AF_INET) + struct.pack("!H", own.getsockname()[1])
             + socket.inet_aton("127.0.0.1")).ljust(size, b"\0"),
            (struct.pack("=H", socket.AF_UNIX) + target.encode()).ljust(size, b"\0")]
    buf = ctypes.create_string_buffer(addr[0], size)
    # Fixed numbers: each round's TCP and Unix sockets are put under them.
    tcp_at, unix_at, slot = (os.dup(own.fileno()) for _ in range(3))
    stop = threading.Event()

    def swap_fd():
        while not stop.is_set():
            os.dup2(unix_at, slot)
            time.sleep(1e-4)
            os.dup2(tcp_at, slot)
            time.sleep(1e-4)

    def swap_address():
        i = 0
        while not stop.is_set():
            ctypes.memmove(buf, addr[i % 2], size)
            time.sleep(7e-5)
            i += 1
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    swappers = [threading.Thread(target=f, daemon=True) for f in (swap_fd, swap_address)]
    for t in swappers:
        t.start()
    seen = {}
    try:
        for _ in range(rounds):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as unix, socket.socket() as tcp:
                unix.setblocking(False)
                tcp.setblocking(False)
                os.dup2(unix.fileno(), unix_at)
                os.dup2(tcp.fileno(), tcp_at)
                os.dup2(tcp_at, slot)       # from here the slot holds this round's sockets only
                time.sleep(random.random() * 3e-4)
                got = "inside" if libc.connect(slot, buf, size) == 0 else \
                    errno.errorcode.get(ctypes.get_errno(), "?")
                try:
                    got = f"the Unix socket is connected to {unix.getpeername()!r}"
                except OSError:
                    pass
                seen[got] = seen.get(got, 0) + 1
                while True:
                    try:
                        own.accept()[0].close()
                    except BlockingIOError:
                        break
                if got.startswith("the Unix socket"):
                    return f"reached {got!r} ({seen})"
    finally:
        stop.set()
        for t in swappers:
            t.join()
        sys.setswitchinterval(switch)
    raise Refused("NEVER_OUTSIDE", json.dumps(seen))


CLONE_FILES = 0x400


def unix_clone_files_swap(target, rounds=100000):
    """A second process sharing this one's fd table (clone with CLONE_FILES,
    not CLONE_THREAD: no thread of this group) swaps a Unix socket and the
    TCP socket under one fd number while this process, alone in its group,
    connects it to `target`. Inside, the clone itself is refused (EPERM):
    only a group's own threads may share its fd table."""
    tcp = socket.socket()
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    slot = os.dup(tcp.fileno())
    addr = struct.pack("=H", socket.AF_UNIX) + target.encode() + b"\0"
    started_r, started_w = os.pipe()
    pid = sys_call(NR["clone"], CLONE_FILES | signal.SIGCHLD, 0, 0, 0, 0)
    if pid == 0:                    # the sharer: a copy of this process, one fd table
        try:
            os.write(started_w, b"s")
            while True:
                os.dup2(unix.fileno(), slot)
                os.dup2(tcp.fileno(), slot)
        finally:
            os._exit(0)
    seen = {}
    try:
        os.read(started_r, 1)
        for _ in range(rounds):
            got = "inside" if libc.connect(slot, addr, len(addr)) == 0 else \
                errno.errorcode.get(ctypes.get_errno(), "?")
            try:
                return f"reached: the Unix socket is connected to {unix.getpeername()!r}"
            except OSError:
                seen[got] = seen.get(got, 0) + 1
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    raise Refused("NEVER_OUTSIDE", json.dumps(seen))


def unix_scm_rights(target):
    """A Unix socket made by another process of the tree, passed over
    SCM_RIGHTS, then connected to `target` here."""
    a, b = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        socket.send_fds(b, [b"s"], [s.fileno()])
        os._exit(0)
    _msg, fds, _f, _a = socket.recv_fds(a, 1, 1)
    os.waitpid(pid, 0)
    with socket.socket(fileno=fds[0]) as s:
        s.connect(target)
        return _banner(s)


def unix_passed_in(server, target):
    """A socket made outside, received over SCM_RIGHTS from a server outside
    (one the policy names), then connected to `target` here."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(TIMEOUT)
        s.connect(server)
        _msg, fds, _f, _a = socket.recv_fds(s, 16, 1)
    if not fds:
        raise Refused("NO_FD", "the server outside sent no descriptor")
    with socket.socket(fileno=fds[0]) as passed:
        passed.connect(_unix_address(target))
        return _banner(passed)


def inet_passed_in(server, host, port):
    """A TCP socket made outside (in the network namespace of a server
    outside that the policy names), received over SCM_RIGHTS, then connected
    here to `host`:`port`: made outside, it would connect from there."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(TIMEOUT)
        s.connect(server)
        _msg, fds, _f, _a = socket.recv_fds(s, 16, 1)
    if not fds:
        raise Refused("NO_FD", "the server outside sent no descriptor")
    with socket.socket(fileno=fds[0]) as passed:
        passed.settimeout(TIMEOUT)
        passed.connect((host, int(port)))
        return _banner(passed)


def unix_socket_type(kind):
    """socket(AF_UNIX, kind): only the connected kinds may be made."""
    sock_type = {"dgram": socket.SOCK_DGRAM, "raw": socket.SOCK_RAW,
                 "dgram+flags": socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK}[kind]
    os.close(sys_call(NR["socket"], socket.AF_UNIX, sock_type, 0))
    return f"a {kind} Unix socket made"


def unix_sendto(kind, target, received):
    """sendto() with a path on a socket of `kind`: ok if the datagram socket
    outside gets it."""
    family, sock_type = {"stream": (socket.AF_UNIX, socket.SOCK_STREAM),
                         "seqpacket": (socket.AF_UNIX, socket.SOCK_SEQPACKET),
                         "dgram": (socket.AF_UNIX, socket.SOCK_DGRAM),
                         "udp": (socket.AF_INET, socket.SOCK_DGRAM),
                         "tcp": (socket.AF_INET, socket.SOCK_STREAM)}[kind]
    token = _token()
    addr = struct.pack("=H", socket.AF_UNIX) + target.encode() + b"\0"
    with socket.socket(family, sock_type) as s:
        data = token.encode()
        if libc.sendto(s.fileno(), data, len(data), 0, addr, len(addr)) < 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
    return _delivered(None, token, received)


# ------------------------------------------------------------ syscalls

IORING = {"IOPOLL": 1, "SQPOLL": 2, "SQ_AFF": 4, "CQSIZE": 8, "CLAMP": 16, "ATTACH_WQ": 32,
          "R_DISABLED": 64, "SUBMIT_ALL": 128, "COOP_TASKRUN": 256, "TASKRUN_FLAG": 512,
          "SQE128": 1024, "CQE32": 2048, "SINGLE_ISSUER": 4096, "DEFER_TASKRUN": 8192,
          "NO_SQARRAY": 65536}


def _ring(flags, wq_fd=0):
    params = ctypes.create_string_buffer(120)
    struct.pack_into("=IIIII", params, 4, 8, flags, 0, 0, 0)  # cq_entries, flags, cpu, idle, features
    struct.pack_into("=I", params, 24, wq_fd)
    return sys_call(NR["io_uring_setup"], 4, ctypes.addressof(params))


def io_uring_setup(form):
    flags = 0
    for name in filter(None, form.split("|")):
        flags |= IORING[name] if name != "0" else 0
    base = None
    try:
        if flags & IORING["ATTACH_WQ"]:
            base = _ring(0)
        fd = _ring(flags, base or 0)
        os.close(fd)
        return f"ring made with flags {form}"
    finally:
        if base is not None:
            os.close(base)


def io_uring_other(which):
    # fd -1: the call exists if the kernel answers EBADF, not if the filter answers first.
    sys_call(NR[which], -1 & 0xFFFFFFFF, 0, 0, 0, 0, 0)
    return f"{which} accepted fd -1"


def x32(name):
    res = sys_call(X32 | NR[name], *((socket.AF_INET, socket.SOCK_STREAM, 0) if name == "socket" else ()))
    if name == "socket":
        os.close(res)
    return f"x32 {name} returned {res}"


def syscall_number(nr):
    res = sys_call(int(nr))
    return f"syscall {nr} returned {res}"


def native(binary, what):
    """A C probe (int 0x80) printing the same JSON fields."""
    out = subprocess.run([binary, what], capture_output=True, text=True, timeout=10).stdout
    result = json.loads(out.strip().splitlines()[-1])
    if result["ok"]:
        return result["detail"]
    raise Refused(result["errno"], result["detail"])


def socket_family(family):
    """ok if any socket type of this family can be created."""
    seen = {}
    for name, kind in (("STREAM", 1), ("DGRAM", 2), ("RAW", 3), ("SEQPACKET", 5)):
        try:
            os.close(sys_call(NR["socket"], int(family), kind, 0))
            return f"family {family} type {name} created"
        except OSError as e:
            seen[name] = errno.errorcode.get(e.errno, str(e.errno))
    raise Refused(",".join(sorted(set(seen.values()))), json.dumps(seen))


def chroot(path):
    sys_call(NR["chroot"], ctypes.c_char_p(path.encode()))
    return f"chroot to {path}"


def mount_tmpfs(path):
    sys_call(NR["mount"], ctypes.c_char_p(b"none"), ctypes.c_char_p(path.encode()),
             ctypes.c_char_p(b"tmpfs"), 0, 0)
    return f"tmpfs mounted on {path}"


def remount_rw(path):
    sys_call(NR["mount"], 0, ctypes.c_char_p(path.encode()), 0, 32 | 4096, 0)  # MS_REMOUNT|MS_BIND
    return f"{path} remounted read-write"


def write_same(path):
    """Write a kernel knob's own value back: changes nothing if it works."""
    with open(path) as f:
        value = f.read()
    with open(path, "w") as f:
        f.write(value)
    return f"wrote {value.strip()!r} to {path}"


def open_for_write(pattern):
    """Open the first file matching `pattern` for writing, and write nothing:
    proves a knob could be written without changing it."""
    import glob
    matches = sorted(glob.glob(pattern))
    if not matches:
        raise Refused("ABSENT", f"nothing matches {pattern}")
    fd = os.open(matches[0], os.O_WRONLY)
    os.close(fd)
    return f"{matches[0]} opened for writing"


def writable_mount(path):
    """The mount that serves `path` is not read-only."""
    if os.statvfs(path).f_flag & os.ST_RDONLY:
        raise OSError(errno.EROFS, f"{path} is on a read-only mount")
    return f"{path} is on a writable mount"


def kernel_entry(path):
    """Reach a /proc or /sys entry as the kernel serves it: not /dev/null
    bound over it, not a mount of its own (an empty tmpfs), and readable."""
    import stat as st_
    st = os.stat(path)
    if st_.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3):
        raise Refused("MASKED", f"{path} is /dev/null")
    if st.st_dev != os.stat(os.path.dirname(path)).st_dev:
        raise Refused("MASKED", f"{path} is a mount of its own")
    if st_.S_ISDIR(st.st_mode):
        return f"{path} lists {len(os.listdir(path))} entries"
    with open(path, "rb") as f:
        f.read(1)
    return f"{path} read"


def open_by_handle(path):
    handle = ctypes.create_string_buffer(8 + 128)
    struct.pack_into("=I", handle, 0, 128)
    mount_id = ctypes.c_int()
    sys_call(NR["name_to_handle_at"], -100 & 0xFFFFFFFF, ctypes.c_char_p(path.encode()),
             ctypes.addressof(handle), ctypes.addressof(mount_id), 0)
    mount_fd = os.open("/", os.O_RDONLY)
    try:
        fd = sys_call(NR["open_by_handle_at"], mount_fd, ctypes.addressof(handle), os.O_RDONLY)
        os.close(fd)
        return f"opened {path} by its handle"
    finally:
        os.close(mount_fd)


def bpf_map():
    attr = ctypes.create_string_buffer(struct.pack("=IIII", 2, 4, 8, 1), 128)  # BPF_MAP_TYPE_ARRAY
    fd = sys_call(NR["bpf"], 0, ctypes.addressof(attr), 128)  # BPF_MAP_CREATE
    os.close(fd)
    return "bpf map created"


# ------------------------------------------------------------ the doors

def _door(door, host, port):
    s = socket.create_connection(("127.0.0.1", 3128 if door == "http" else 1080), timeout=TIMEOUT)
    if door == "http":
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = s.recv(4096)
            if not chunk:
                break
            head += chunk
        status = head.split(b" ", 2)[1].decode() if head.startswith(b"HTTP/") else "NONE"
        if status != "200":
            s.close()
            raise Refused(f"HTTP_{status}", head.split(b"\r\n", 1)[0].decode(errors="replace"))
        return s, head.split(b"\r\n\r\n", 1)[1]
    s.sendall(b"\x05\x01\x00")
    if s.recv(2) != b"\x05\x00":
        raise Refused("SOCKS_GREETING")
    try:
        import ipaddress
        ip = ipaddress.ip_address(host)
        addr = (b"\x01" if ip.version == 4 else b"\x04") + ip.packed
    except ValueError:
        addr = b"\x03" + bytes([len(host)]) + host.encode()
    s.sendall(b"\x05\x01\x00" + addr + struct.pack("!H", int(port)))
    reply = b""
    while len(reply) < 2:
        chunk = s.recv(2 - len(reply))
        if not chunk:
            break
        reply += chunk
    if len(reply) < 2 or reply[1] != 0:
        s.close()
        raise Refused(f"SOCKS_0x{reply[1]:02x}" if len(reply) == 2 else "SOCKS_CLOSED")
    need = {1: 4, 4: 16}.get(s.recv(2)[1], None)
    s.recv((need or s.recv(1)[0]) + 2)
    return s, b""


def door(which, host, port):
    """Open a tunnel through a door; the detail is the first line the far end sends."""
    s, early = _door(which, host, port)
    with s:
        s.settimeout(TIMEOUT)
        data = early
        try:
            while b"\n" not in data:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
        except socket.timeout:
            pass
        return data.split(b"\n")[0].decode(errors="replace").strip() or "(tunnel open, nothing sent)"


def own_loopback_via_door(which, port):
    """Listen on this sandbox's own 127.0.0.1:PORT (answering 'inside'), then
    ask the door for 127.0.0.1:PORT: the detail says whose listener answered."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", int(port)))
    listener.listen(8)

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.sendall(b"inside\n")
            conn.close()
    threading.Thread(target=serve, daemon=True).start()
    direct = tcp_banner("127.0.0.1", port)
    via = door(which, "127.0.0.1", port)
    listener.close()
    return f"direct={direct} door={via}"


# ------------------------------------------------------------ the runner

def _outcome(fn, args):
    try:
        detail = fn(*args)
        return {"ok": True, "errno": None, "detail": str(detail)}
    except Refused as r:
        return {"ok": False, "errno": r.name, "detail": r.detail}
    except socket.gaierror as e:
        return {"ok": False, "errno": "GAIERROR", "detail": str(e)}
    except socket.timeout:
        return {"ok": False, "errno": "ETIMEDOUT", "detail": "timed out"}
    except OSError as e:
        name = errno.errorcode.get(e.errno, str(e.errno)) if e.errno else "OSERROR"
        return {"ok": False, "errno": name, "detail": str(e)}
    except Exception as e:  # noqa: BLE001 - a probe bug must show, not pass as a refusal
        return {"ok": False, "errno": "PROBE_BUG", "detail": repr(e)}


# An attempt's own time (its alarm), then what the whole attempt may take
# before its process group is killed: a race that runs past its alarm must not
# leave a grandchild (a listener) holding the result pipe, so that the probe
# waits forever.
ATTEMPT_SECONDS = 15
ATTEMPT_DEADLINE = 25


def run_one(attempt):
    """In a forked child, in a process group of its own: an attempt that works
    may change this process (join a namespace, chroot), and must not change
    the next attempt. Once the child has ended (or run past the deadline),
    whatever it left in its group is killed, so the pipe always ends."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.setpgid(0, 0)
        signal.alarm(ATTEMPT_SECONDS)
        res = _outcome(globals()[attempt["attempt"]], attempt.get("args", []))
        os.write(w, json.dumps(res).encode())
        os._exit(0)
    os.close(w)
    try:
        os.setpgid(pid, pid)         # whichever of us gets there first
    except OSError:
        pass
    data, status, timed_out = b"", None, False
    deadline = time.monotonic() + ATTEMPT_DEADLINE
    while True:
        if status is None:
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status = st
                _kill_group(pid)
        if time.monotonic() > deadline:
            if timed_out:
                break                # a holder outside the group: stop waiting
            timed_out = True
            _kill_group(pid)
            deadline += 5
        readable, _, _ = select.select([r], [], [], 0.2)
        if readable:
            chunk = os.read(r, 65536)
            if not chunk:
                break
            data += chunk
    os.close(r)
    if status is None:
        _, status = os.waitpid(pid, 0)
    if data and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        return json.loads(data)
    return {"ok": False, "errno": "CRASH", "detail": f"wait status {status}"
            + (f", killed after {ATTEMPT_DEADLINE} s" if timed_out else "")}


def _kill_group(pgid):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass


def main():
    import shutil
    import tempfile
    with open(sys.argv[1]) as f:
        plan = json.load(f)
    # Every attempt's scratch directory (_scratch) inside one of this run's,
    # removed once all have run: the attempts end with os._exit, in children.
    tempfile.tempdir = tempfile.mkdtemp(prefix="vpnw-probe-")
    try:
        for attempt in plan:
            started = time.monotonic()
            res = run_one(attempt)
            res["ms"] = round((time.monotonic() - started) * 1000)
            print(json.dumps({"id": attempt["id"], **res}), flush=True)
    finally:
        shutil.rmtree(tempfile.tempdir, ignore_errors=True)


if __name__ == "__main__":
    main()
