"""The WireGuard path's namespace: a process of vpnw's own that holds the
tunnel (run by the broker as `python -m stages.broker.wireguard.path_process PARENT_PID CONTROL_FD`).

    machine's network                 | path namespace (user + net + mount, made here)
    outer UDP socket  <-- relay -->   | inner UDP socket 127.0.0.1:R  <->  wireguard-go :51820
    (connected to the one endpoint)   | tun "vpnw0": the .conf's addresses, AllowedIPs routes
                                      | broker's sockets, made here and handed over by fd

Why a relay of ours: wireguard-go binds its own UDP socket, and in a network
namespace with only lo and the tunnel that socket reaches nothing. The outer
socket is created before the namespace is (a socket stays in the namespace it
was made in) and connected to the endpoint, so the path namespace has exactly
one way out: datagrams to that endpoint, from this process. No route,
interface or socket file of the machine changes, and no helper package
(pasta, slirp4netns) is needed. wireguard-go's peer endpoint is the inner
socket; the relay copies datagrams both ways.

Control protocol: stages/broker/wireguard/control.py (typed messages, both sides).
EOF on the control socket ends the path: wireguard-go is killed, and with
this process go the namespaces, the tun device and the tmpfs.
"""
from __future__ import annotations

import fcntl
import json
import os
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time

from stages.broker.wireguard import control
from stages.config.environment import EnvironmentProblem, handshake_timeout
from stages.kernel import privileges as priv

TUN_NAME = "vpnw0"
LISTEN_PORT = 51820
SOCKET_BATCH = 32
_TUNSETIFF = 0x400454CA
_IFF_TUN = 0x0001           # without IFF_NO_PI: what Debian's wireguard-go 0.0.20220316 expects
_UAPI = f"/run/wireguard/{TUN_NAME}.sock"


class PathSetupError(Exception):
    """Why the tunnel could not be opened (a sentence, never a key)."""


def _uapi(request: str, timeout: float = 3.0) -> dict[str, list[str]]:
    """One UAPI exchange with wireguard-go; -> its answer's keys and values."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(_UAPI)
        s.sendall(request.encode())
        data = b""
        while not data.endswith(b"\n\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    answer: dict[str, list[str]] = {}
    for line in data.decode().splitlines():
        if "=" in line:
            key, value = line.split("=", 1)
            answer.setdefault(key, []).append(value)
    return answer


def uapi_set_lines(tunnel: dict, relay_port: int, keepalive: int) -> str:
    """The UAPI `set=1` request for the tunnel (pure; the keys are hex)."""
    lines = ["set=1", f"private_key={tunnel['private_key']}", f"listen_port={LISTEN_PORT}",
             "replace_peers=true", f"public_key={tunnel['public_key']}"]
    if tunnel.get("preshared_key"):
        lines.append(f"preshared_key={tunnel['preshared_key']}")
    lines += [f"endpoint=127.0.0.1:{relay_port}", "replace_allowed_ips=true"]
    lines += [f"allowed_ip={net}" for net in tunnel["allowed_ips"]]
    lines.append(f"persistent_keepalive_interval={keepalive}")
    return "\n".join(lines) + "\n\n"


# A user's PATH often lacks /usr/sbin, where Debian puts ip.
_IP = shutil.which("ip", path="/usr/sbin:/usr/bin:/sbin:/bin") or "ip"


def _ip(*args: str) -> None:
    done = subprocess.run([_IP, *args], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise PathSetupError(f"ip {' '.join(args)}: {done.stderr.strip()[:200]}")


def _outer_socket(host: str, port: int) -> socket.socket:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except OSError as exc:
        raise PathSetupError(f"the endpoint {host} was not resolved ({exc})") from None
    family, kind, proto, _, address = infos[0]
    outer = socket.socket(family, kind | socket.SOCK_CLOEXEC, proto)
    outer.connect(address)
    outer.setblocking(False)
    return outer


def _enter_namespace() -> None:
    uid, gid = os.getuid(), os.getgid()
    try:
        priv.unshare(priv.CLONE_NEWUSER | priv.CLONE_NEWNET | priv.CLONE_NEWNS)
        # root inside (mapped to the caller): wireguard-go and ip keep
        # CAP_NET_ADMIN over this namespace across execve, and only over it.
        priv.write_id_maps(uid, gid, root_inside=True)
        priv.mount(None, "/", None, priv.MS_REC | priv.MS_PRIVATE)
        # wireguard-go watches /var/run/wireguard/<name>.sock even when handed
        # its UAPI socket: a private tmpfs keeps that file out of the machine.
        priv.mount("tmpfs", "/run", "tmpfs", priv.MS_NOSUID | priv.MS_NODEV, "mode=0700")
        os.mkdir("/run/wireguard", 0o700)
    except OSError as exc:
        raise PathSetupError(f"cannot create the path's namespaces ({exc.strerror}); "
                             "run vpnw doctor") from None


def _open_tun() -> int:
    try:
        fd = os.open("/dev/net/tun", os.O_RDWR)
    except OSError as exc:
        raise PathSetupError(f"/dev/net/tun is not usable by this user ({exc.strerror}); "
                             "run vpnw doctor") from None
    try:
        fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH22x", TUN_NAME.encode(), _IFF_TUN))
    except OSError as exc:
        os.close(fd)
        raise PathSetupError(f"cannot create the tun device ({exc.strerror})") from None
    return fd


def _start_wireguard_go(tun_fd: int, uapi: socket.socket) -> subprocess.Popen:
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "WG_TUN_FD": str(tun_fd),
           "WG_UAPI_FD": str(uapi.fileno()), "WG_PROCESS_FOREGROUND": "1", "LOG_LEVEL": "error"}

    def die_with_us():
        priv.prctl(priv.PR_SET_PDEATHSIG, signal.SIGKILL)

    try:
        return subprocess.Popen(["wireguard-go", TUN_NAME], env=env, pass_fds=(tun_fd, uapi.fileno()),
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, preexec_fn=die_with_us)
    except FileNotFoundError:
        raise PathSetupError("wireguard-go is not installed (apt-get install wireguard-go)") from None


def _wait_uapi(wg: subprocess.Popen, deadline: float) -> None:
    while True:
        if wg.poll() is not None:
            err = wg.stderr.read().decode("utf-8", "replace").strip().splitlines()
            raise PathSetupError("wireguard-go stopped: " + (err[-1][:200] if err else f"exit {wg.returncode}"))
        try:
            _uapi("get=1\n\n", timeout=1.0)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise PathSetupError("wireguard-go did not answer on its UAPI socket") from None
            time.sleep(0.02)


class PathNamespace:
    """The running path: the relay, the control socket, wireguard-go."""

    def __init__(self, ctl: socket.socket, tunnel: dict):
        self.ctl = ctl
        self.tunnel = tunnel
        self.wg: subprocess.Popen | None = None
        self.outer = _outer_socket(tunnel["endpoint_host"], tunnel["endpoint_port"])
        _enter_namespace()
        tun_fd = _open_tun()
        self.inner = socket.socket(socket.AF_INET, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        uapi = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        uapi.bind(_UAPI)
        uapi.listen(8)
        _ip("link", "set", "lo", "up")
        self.inner.bind(("127.0.0.1", 0))
        self.inner.setblocking(False)
        self.wg = _start_wireguard_go(tun_fd, uapi)
        os.close(tun_fd)
        uapi.close()

    def configure(self, deadline: float) -> None:
        _wait_uapi(self.wg, deadline)
        tunnel = self.tunnel
        # A keepalive now starts the handshake (wireguard-go sends one when
        # the interval goes from 0 to non-zero); the user's own interval is
        # set back once the handshake is done.
        answer = _uapi(uapi_set_lines(tunnel, self.inner.getsockname()[1], 1))
        if answer.get("errno") != ["0"]:
            raise PathSetupError(f"wireguard-go refused the configuration (errno {answer.get('errno')})")
        if tunnel.get("mtu"):
            _ip("link", "set", TUN_NAME, "mtu", str(tunnel["mtu"]))
        for address in tunnel["addresses"]:
            _ip("-6" if ":" in address else "-4", "address", "add", address, "dev", TUN_NAME)
        _ip("link", "set", TUN_NAME, "up")
        for net in tunnel["allowed_ips"]:
            _ip("-6" if ":" in net else "-4", "route", "add", net, "dev", TUN_NAME)

    def handshake_done(self) -> bool:
        try:
            answer = _uapi("get=1\n\n", timeout=1.0)
        except OSError:
            return False
        return any(v != "0" for v in answer.get("last_handshake_time_sec", []))

    def health(self) -> control.Up | control.Down:
        """Up, or Down with why: asked by the broker after a dial failed,
        so that a dead tunnel is path-down, not the destination's fault."""
        if self.wg.poll() is not None:
            return control.Down("wireguard-go stopped")
        try:
            socket.if_nametoindex(TUN_NAME)
        except OSError:
            return control.Down("the tun device is gone")
        try:
            answer = _uapi("get=1\n\n", timeout=1.0)
        except OSError:
            return control.Down("wireguard-go does not answer")
        last = max((int(v) for v in answer.get("last_handshake_time_sec", ["0"])), default=0)
        # WireGuard drops a session 180 s after its handshake (REJECT_AFTER_TIME);
        # older than that with the peer silent, nothing gets through.
        if last and time.time() - last > 180 + 15:
            return control.Down(f"no handshake with {self.tunnel['endpoint']} for {int(time.time() - last)} s")
        return control.Up()

    def relay(self, sock: socket.socket) -> None:
        """Move the datagrams waiting on one side to the other."""
        for _ in range(256):
            try:
                if sock is self.inner:
                    data, source = self.inner.recvfrom(65535)
                    if source == ("127.0.0.1", LISTEN_PORT):
                        self.outer.send(data)
                else:
                    data = self.outer.recv(65535)
                    self.inner.sendto(data, ("127.0.0.1", LISTEN_PORT))
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                # ICMP errors surface on the connected outer socket: the peer
                # is retried by wireguard-go itself.
                continue

    def serve(self, data: bytes) -> None:
        try:
            request = control.decode_request(data)
        except control.ControlError as exc:
            self.ctl.send(control.encode_reply(control.ControlRefused(str(exc))))
            return
        if isinstance(request, control.HealthQuestion):
            self.ctl.send(control.encode_reply(self.health()))
            return
        if self.wg.poll() is not None:
            # Its tun is gone with it; say so rather than hand out a socket
            # that can only fail.
            self.ctl.send(control.encode_reply(control.Down("wireguard-go stopped")))
            return
        # A batch of TCP sockets: one round trip for many dials.
        count = SOCKET_BATCH if request.batch else 1
        kind = socket.SOCK_STREAM if request.stream else socket.SOCK_DGRAM
        made = []
        try:
            for _ in range(count):
                made.append(socket.socket(request.family, kind))
        except OSError as exc:
            if not made:
                self.ctl.send(control.encode_reply(control.ControlRefused(exc.strerror)))
                return
        try:
            socket.send_fds(self.ctl, [b"s"], [m.fileno() for m in made])
        finally:
            for m in made:
                m.close()

    def run(self, handshake_timeout: float) -> int:
        sel = selectors.DefaultSelector()
        sel.register(self.inner, selectors.EVENT_READ)
        sel.register(self.outer, selectors.EVENT_READ)
        sel.register(self.ctl, selectors.EVENT_READ)
        sel.register(self.wg.stderr, selectors.EVENT_READ)
        deadline = time.monotonic() + handshake_timeout
        up = False
        next_poll = 0.0
        while True:
            now = time.monotonic()
            if not up and now >= next_poll:
                if self.handshake_done():
                    up = True
                    if self.tunnel["keepalive"] != 1:
                        _uapi(f"set=1\npublic_key={self.tunnel['public_key']}\n"
                              f"persistent_keepalive_interval={self.tunnel['keepalive']}\n\n")
                    self.ctl.send(control.encode_start(control.Up()))
                elif now > deadline:
                    self.ctl.send(control.encode_start(control.Down(
                        f"no handshake with {self.tunnel['endpoint']} within {handshake_timeout:g} s "
                        "(a wrong key, or the endpoint unreachable or not a WireGuard server)")))
                    return 1
                next_poll = now + 0.05
            for key, _ in sel.select(0.05 if not up else None):
                if key.fileobj is self.ctl:
                    try:
                        request = self.ctl.recv(64)
                    except OSError:
                        request = b""
                    if not request:
                        return 0
                    self.serve(request)
                    if self.wg.poll() is not None:
                        return 1
                elif key.fileobj is self.wg.stderr:
                    if not os.read(self.wg.stderr.fileno(), 4096) and self.wg.poll() is not None:
                        return 1
                    if self.wg.poll() is not None:
                        return 1
                else:
                    self.relay(key.fileobj)

    def close(self) -> None:
        if self.wg is not None and self.wg.poll() is None:
            self.wg.kill()
            self.wg.wait()


def main(argv: list[str]) -> int:
    priv.prctl(priv.PR_SET_PDEATHSIG, signal.SIGKILL)
    if len(argv) != 3 or os.getppid() != int(argv[1]):
        return 1      # the broker is already gone
    ctl = socket.socket(fileno=int(argv[2]))
    path = None
    try:
        try:    # checked by the command line already (exit 121); here too, closed
            timeout = handshake_timeout(dict(os.environ))
        except EnvironmentProblem as exc:
            raise PathSetupError(str(exc)) from None
        tunnel = json.loads(ctl.recv(65536))
        path = PathNamespace(ctl, tunnel)
        path.configure(time.monotonic() + 5.0)
        return path.run(timeout)
    except PathSetupError as exc:
        try:
            ctl.send(control.encode_start(control.Down(str(exc))))
        except OSError:
            pass
        return 1
    finally:
        if path is not None:
            path.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
