"""Ways out, tried one at a time: `probe.py NAME [ARG]` prints `RESULT <what happened>`.

<what happened> is OK (the attempt worked), an errno name (ENETUNREACH ...),
or GAIERROR for a failed lookup. Run inside the sandbox and, where safe,
outside it as the control. Standard library only: it must run as any user.
"""
import ctypes
import errno
import os
import socket
import struct
import sys

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
SYS = {"socket": 41, "ptrace": 101, "io_uring_setup": 425, "unshare": 272}


def raw_syscall(nr, *args):
    res = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    if res == -1:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return res


def tcp4(_):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(3)
    s.connect(("192.0.2.1", 80))


def tcp6(_):
    s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    s.settimeout(3)
    s.connect(("2001:db8::1", 80))


def udp4(_):
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("192.0.2.1", 53))


def dns(name):
    socket.getaddrinfo(name or "vpnw-probe.example", 443)


def unix_path(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)


def socketpair_dgram(_):
    socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)


def socketpair_seqpacket(_):
    socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


def socketpair_stream(_):
    socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)


def io_uring(_):
    params = ctypes.create_string_buffer(120)
    raw_syscall(SYS["io_uring_setup"], 1, ctypes.addressof(params))


def socket_high_bits(_):
    # 0x1_00000001: a 64-bit compare sees "not AF_UNIX", the kernel sees AF_UNIX.
    # A datagram one: the kind the filter refuses (a stream one is the
    # program's to make since issue 26).
    os.close(raw_syscall(SYS["socket"], 0x100000001, socket.SOCK_DGRAM, 0))


def x32_socket(_):
    os.close(raw_syscall(0x40000000 | SYS["socket"], socket.AF_UNIX, socket.SOCK_STREAM, 0))


def vsock(_):
    socket.socket(40, socket.SOCK_STREAM)  # AF_VSOCK; never connected


def fd_open(fd):
    os.fstat(int(fd))


def kill0(pid):
    os.kill(int(pid), 0)


def ptrace_attach(pid):
    raw_syscall(SYS["ptrace"], 16, int(pid), 0, 0)  # PTRACE_ATTACH


def ptrace_all(_):
    """Attach to every other process this one can see; OK only if one works."""
    errors = set()
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) not in (os.getpid(),):
            try:
                raw_syscall(SYS["ptrace"], 16, int(name), 0, 0)
                return
            except OSError as e:
                errors.add(errno.errorcode[e.errno])
    raise OSError(errno.EPERM if errors <= {"EPERM", "ESRCH"} else errno.EIO, "")


def tiocsti(_):
    import fcntl
    import termios
    with open("/dev/null", "rb") as f:
        fcntl.ioctl(f, termios.TIOCSTI, b"x")


def keyctl(_):
    raw_syscall(250, 0, -3 & 0xFFFFFFFFFFFFFFFF, 1)  # KEYCTL_GET_KEYRING_ID(session, create)


def unshare_user(_):
    raw_syscall(SYS["unshare"], 0x10000000)


def netlink_newlink(_):
    """RTM_NEWLINK veth pair over raw netlink; the kernel's ack carries the errno."""
    name = b"vpnwx0\0"
    peer_name = b"vpnwx1\0"

    def attr(kind, data):
        ln = 4 + len(data)
        return struct.pack("=HH", ln, kind) + data + b"\0" * ((-ln) % 4)
    ifinfo = struct.pack("=BxHiII", 0, 0, 0, 0, 0)
    peer = attr(1, ifinfo + attr(3, peer_name))               # VETH_INFO_PEER
    linkinfo = attr(1, b"veth\0") + attr(2, peer)               # IFLA_INFO_KIND, _DATA
    body = ifinfo + attr(3, name) + attr(18, linkinfo)          # IFLA_IFNAME, IFLA_LINKINFO
    hdr = struct.pack("=IHHII", 16 + len(body), 16, 0x1 | 0x4 | 0x400 | 0x200, 1, 0)
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
    s.send(hdr + body)
    reply = s.recv(65536)
    code = struct.unpack_from("=i", reply, 16)[0]
    if code:
        raise OSError(-code, os.strerror(-code))


def door(port):
    s = socket.create_connection(("127.0.0.1", int(port)), timeout=5)
    s.sendall(b"hello")
    reply = s.recv(16)
    if reply != b"bye":
        raise OSError(errno.EPROTO, "")
    print("REPLY", reply.decode() or "-")


def status(_):
    with open("/proc/self/status") as f:
        for line in f:
            if line.split(":")[0] in ("CapEff", "CapPrm", "CapBnd", "CapAmb", "CapInh",
                                      "NoNewPrivs", "Seccomp"):
                print("STATUS", line.split(":")[0], line.split(":")[1].strip())


def fds(_):
    print("FDS", " ".join(sorted(os.listdir("/proc/self/fd"), key=int)))


def main():
    name, arg = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else None)
    try:
        globals()[name](arg)
    except socket.gaierror:
        print("RESULT GAIERROR")
    except OSError as e:
        print("RESULT", errno.errorcode.get(e.errno, str(e.errno)) if e.errno else "OSERROR")
    else:
        print("RESULT OK")
    sys.stdout.flush()


main()
