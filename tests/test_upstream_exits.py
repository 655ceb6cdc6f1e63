"""check_path and dial_via against REAL exits (danted, microsocks, tinyproxy, squid)
and hostile fakes, all inside a private network namespace made for this module.

Every exit resolves tracker.office.internal to 127.0.0.1 from its own /etc/hosts
(a private mount namespace); this test process cannot resolve that name, so a
working dial to it proves the name was resolved at the exit.
"""
import asyncio
import os
import socket
import threading

import pytest

from ci_support import cannot

import exits
from stages.broker.dial import DialError, PathDownError
from stages.broker.dialers import dialer_for
from stages.broker.upstream import check_path, dial_via
from stages.config.paths import DIRECT, PathSpec

SECRET = "s3cret-Qx7"
INTERNAL = "tracker.office.internal"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: a private network namespace "
                                "made from a thread, and mount namespaces for the exits' /etc/hosts")


class EchoServer:
    """Echoes bytes on 127.0.0.1 inside the namespace; counts the connections it accepted."""

    def __init__(self, listener: socket.socket):
        self.listener = listener
        self.port = listener.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn):
        with conn:
            while True:
                data = conn.recv(65536)
                if not data:
                    return
                conn.sendall(data)


class FakeExit:
    """A hostile exit: answers each connection with scripted bytes, whatever is asked."""

    def __init__(self, listener: socket.socket, script: list[bytes]):
        self.listener = listener
        self.port = listener.getsockname()[1]
        self.script = script
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                try:
                    for answer in self.script:
                        if not conn.recv(4096):
                            break
                        conn.sendall(answer)
                    conn.recv(4096)
                except OSError:
                    pass


def listen(ns):
    return ns.run(socket.create_server, ("127.0.0.1", 0))


@pytest.fixture(scope="module")
def exit_world():
    try:
        ns = exits.PrivateNetns()
    except OSError as exc:
        pytest.skip(f"cannot make a private network namespace: {exc}")
    started = {}
    try:
        echo = EchoServer(listen(ns))
        for label, kind, credentials in [
            ("danted", "danted", None),
            ("microsocks", "microsocks", None),
            ("microsocks-auth", "microsocks", ("alice", SECRET)),
            ("tinyproxy", "tinyproxy", None),
            ("tinyproxy-auth", "tinyproxy", ("alice", SECRET)),
            ("squid", "squid", None),
            ("squid-auth", "squid", ("alice", SECRET)),
        ]:
            if exits.missing(kind):
                continue
            username, password = credentials or (None, None)
            port = ns.run(exits.free_port)
            started[label] = ns.run(exits.start_exit, kind, port, username, password,
                                    {INTERNAL: "127.0.0.1"})
        yield ns, echo, started
    finally:
        for exit_ in started.values():
            exit_.stop()
        ns.close()


def spec(exit_, scheme=None, password=None, name="office"):
    username = exit_.username
    if password is None:
        password = exit_.password
    return PathSpec(name=name, type="proxy", scheme=scheme or exit_.scheme, host="127.0.0.1",
                    port=exit_.port, username=username, password=password if username else None,
                    resolves_at_exit=(scheme or exit_.scheme) != "socks5")


def run(ns, coroutine):
    return ns.run(asyncio.run, coroutine)


def echo_through(sock: socket.socket) -> None:
    payload = os.urandom(200_000) + b"\x00\r\n\r\nEND"
    sock.setblocking(True)
    sock.settimeout(10)
    received = bytearray()
    writer = threading.Thread(target=sock.sendall, args=(payload,))
    writer.start()
    while len(received) < len(payload):
        chunk = sock.recv(65536)
        assert chunk, "the tunnel closed early"
        received += chunk
    writer.join()
    assert bytes(received) == payload
    sock.close()


ALL = ["danted", "microsocks", "microsocks-auth", "tinyproxy", "tinyproxy-auth", "squid", "squid-auth"]
SOCKS = ["danted", "microsocks", "microsocks-auth"]


def get_exit(exit_world, label):
    started = exit_world[2]
    if label not in started:
        cannot(f"{label}: {exits.missing(label.split('-')[0])}")
    return started[label]


@pytest.mark.parametrize("label", ALL)
def test_check_path_passes(exit_world, label):
    ns, _, _ = exit_world
    assert run(ns, check_path(spec(get_exit(exit_world, label)))) is None


@pytest.mark.parametrize("label", ALL)
def test_dial_by_address_and_echo_byte_exact(exit_world, label):
    ns, echo, _ = exit_world
    exit_ = get_exit(exit_world, label)
    sock, reached = run(ns, dial_via(spec(exit_), "127.0.0.1", echo.port, ("127.0.0.1",)))
    assert reached == "127.0.0.1"
    assert sock.getblocking() is False and sock.getpeername()[1] == exit_.port
    echo_through(sock)


@pytest.mark.parametrize("label", ALL)
def test_name_is_resolved_at_the_exit(exit_world, label):
    ns, echo, _ = exit_world
    with pytest.raises(socket.gaierror):
        socket.getaddrinfo(INTERNAL, 80)   # not resolvable here, only at the exit
    sock, reached = run(ns, dial_via(spec(get_exit(exit_world, label)), INTERNAL, echo.port, ()))
    assert reached == f"{INTERNAL}"
    echo_through(sock)


@pytest.mark.parametrize("label", SOCKS)
def test_socks5_sends_the_checked_address_never_the_name(exit_world, label):
    ns, echo, _ = exit_world
    path = spec(get_exit(exit_world, label), scheme="socks5")
    # The name is one the exit would resolve (to 127.0.0.1); vpnw must send the
    # address it checked instead: the first refuses, the second is the echo.
    sock, reached = run(ns, dial_via(path, INTERNAL, echo.port, ("127.0.0.2", "127.0.0.1")))
    assert reached == "127.0.0.1"
    echo_through(sock)
    # Only an address that refuses: the name is never tried.
    with pytest.raises(DialError) as caught:
        run(ns, dial_via(path, INTERNAL, 1, ("127.0.0.1",)))
    assert caught.value.error in ("refused", "unreachable")


@pytest.mark.parametrize("label", ALL)
def test_destination_refused_at_the_exit(exit_world, label):
    ns, _, _ = exit_world
    with pytest.raises(DialError) as caught:
        run(ns, dial_via(spec(get_exit(exit_world, label)), "127.0.0.1", 1, ("127.0.0.1",)))
    assert caught.value.error in ("refused", "unreachable")


@pytest.mark.parametrize("label", ["microsocks-auth", "tinyproxy-auth"])
def test_wrong_password_is_path_down_without_the_password(exit_world, label):
    ns, echo, _ = exit_world
    wrong = "WRONG-pw-" + SECRET
    path = spec(get_exit(exit_world, label), password=wrong)
    with pytest.raises(PathDownError) as caught:
        run(ns, check_path(path))
    message = str(caught.value)
    # where the path leads, not its name (vpnw's message names it): "http://host:port: the exit ..."
    assert "refused the username/password" in message and "office" not in message
    assert message.startswith(("socks5h://127.0.0.1:", "http://127.0.0.1:")), message
    assert wrong not in message and SECRET not in message
    with pytest.raises(DialError) as dial_caught:
        run(ns, dial_via(path, "127.0.0.1", echo.port, ("127.0.0.1",)))
    assert dial_caught.value.error == "path-down" and wrong not in str(dial_caught.value)


def test_squid_bad_password_is_seen_by_the_check(exit_world):
    # squid answers OPTIONS * (501) before it checks credentials; with credentials
    # the check asks for a CONNECT (to the exit itself), which squid authenticates.
    ns, echo, _ = exit_world
    wrong = "WRONG-pw-" + SECRET
    path = spec(get_exit(exit_world, "squid-auth"), password=wrong)
    with pytest.raises(PathDownError) as caught:
        run(ns, check_path(path))
    assert "refused the username/password" in str(caught.value) and wrong not in str(caught.value)
    with pytest.raises(DialError) as dial_caught:
        run(ns, dial_via(path, "127.0.0.1", echo.port, ("127.0.0.1",)))
    assert dial_caught.value.error == "path-down" and wrong not in str(dial_caught.value)


@pytest.mark.parametrize("label", ["microsocks-auth", "tinyproxy-auth", "squid-auth"])
def test_missing_credentials_are_refused(exit_world, label):
    ns, echo, _ = exit_world
    exit_ = get_exit(exit_world, label)
    path = PathSpec(name="office", type="proxy", scheme=exit_.scheme, host="127.0.0.1", port=exit_.port,
                    resolves_at_exit=True)
    with pytest.raises(DialError) as caught:
        run(ns, dial_via(path, "127.0.0.1", echo.port, ("127.0.0.1",)))
    assert caught.value.error == "path-down"


def test_nothing_listening_is_path_down(exit_world):
    ns, echo, _ = exit_world
    port = ns.run(exits.free_port)
    for scheme in ("socks5h", "socks5", "http"):
        path = PathSpec(name="office", type="proxy", scheme=scheme, host="127.0.0.1", port=port,
                        resolves_at_exit=scheme != "socks5")
        with pytest.raises(PathDownError) as caught:
            run(ns, check_path(path, timeout=3))
        # The text follows "the path 'office' is down: ": where it leads, never its name.
        assert str(caught.value).startswith(f"{scheme}://127.0.0.1:{port}: "), caught.value
        assert "office" not in str(caught.value)
        before = echo.accepted
        with pytest.raises(DialError) as dial_caught:
            run(ns, dial_via(path, "127.0.0.1", echo.port, ("127.0.0.1",)))
        assert dial_caught.value.error == "path-down"
        assert echo.accepted == before, "a dial reached the destination without the exit"


@pytest.mark.parametrize("kind", ["microsocks", "tinyproxy"])
def test_exit_killed_mid_run_fails_closed(exit_world, kind):
    ns, echo, _ = exit_world
    if exits.missing(kind):
        cannot(exits.missing(kind))
    exit_ = ns.run(exits.start_exit, kind, ns.run(exits.free_port))
    try:
        path = spec(exit_)
        run(ns, check_path(path))
        sock, _ = run(ns, dial_via(path, "127.0.0.1", echo.port, ("127.0.0.1",)))
        echo_through(sock)
    finally:
        exit_.stop()
    before = echo.accepted
    with pytest.raises(DialError) as caught:
        run(ns, dial_via(path, "127.0.0.1", echo.port, ("127.0.0.1",)))
    assert caught.value.error in ("path-down", "refused")
    assert echo.accepted == before, "never a direct connection when the exit is gone"


@pytest.mark.parametrize("scheme, script", [
    ("socks5h", [b"\x05\x00", b"\x05\x00\x00\x09garbage!"]),        # unknown address type
    ("socks5h", [b"\x05\x00", b"HTTP/1.1 200 OK\r\n\r\n"]),          # wrong protocol
    ("socks5h", [b"\x05\x07"]),                                     # method never offered
    ("http", [b"SSH-2.0-OpenSSH_9.2\r\n\r\n"]),
    ("http", [b"HTTP/1.1 200 OK\r\nbroken header\r\n\r\n"]),
])
def test_hostile_exit_is_a_bad_reply(exit_world, scheme, script):
    ns, echo, _ = exit_world
    fake = FakeExit(listen(ns), script)
    path = PathSpec(name="evil", type="proxy", scheme=scheme, host="127.0.0.1", port=fake.port,
                    resolves_at_exit=True)
    before = echo.accepted
    with pytest.raises(DialError) as caught:
        run(ns, dial_via(path, "127.0.0.1", echo.port, ("127.0.0.1",), timeout=5))
    # A bad reply means the path is broken: the record's "path-down", and says why.
    assert caught.value.error == "path-down" and "bad reply from the exit" in caught.value.reason
    assert echo.accepted == before
    fake.listener.close()


def test_hostile_exit_fails_the_check(exit_world):
    ns, _, _ = exit_world
    fake = FakeExit(listen(ns), [b"\x04\x5a"])
    path = PathSpec(name="evil", type="proxy", scheme="socks5h", host="127.0.0.1", port=fake.port,
                    resolves_at_exit=True)
    with pytest.raises(PathDownError, match="does not answer as a SOCKS5 proxy"):
        run(ns, check_path(path, timeout=5))
    fake.listener.close()


def test_exit_echoing_the_password_never_reaches_a_message(exit_world):
    # Messages are built from parts vpnw knows; the exit's reason phrase is not one.
    ns, echo, _ = exit_world
    import base64
    token = base64.b64encode(f"alice:{SECRET}".encode()).decode()
    fake = FakeExit(listen(ns), [f"HTTP/1.1 502 {SECRET} {token}\r\n\r\n".encode()])
    path = PathSpec(name="evil", type="proxy", scheme="http", host="127.0.0.1", port=fake.port,
                    username="alice", password=SECRET, resolves_at_exit=True)
    with pytest.raises(DialError) as caught:
        run(ns, dial_via(path, "example.org", 443, (), timeout=5))
    assert caught.value.reason == "the exit could not reach example.org:443: it answered 502 Bad Gateway"
    assert SECRET not in str(caught.value) and token not in str(caught.value)
    fake.listener.close()


def test_a_one_letter_password_leaves_messages_whole(exit_world):
    # Scrubbing by text once turned "connect to the exit" into "conn***ct to th*** ***xit".
    ns, _, _ = exit_world
    fake = FakeExit(listen(ns), [b"HTTP/1.1 407 e\r\n\r\n"])
    path = PathSpec(name="office", type="proxy", scheme="http", host="127.0.0.1", port=fake.port,
                    username="e", password="e", resolves_at_exit=True)
    with pytest.raises(DialError) as caught:
        run(ns, dial_via(path, "example.org", 443, (), timeout=5))
    assert caught.value.reason == (f"path office (http://127.0.0.1:{fake.port}): the exit "
                                   "refused the username/password (407)")
    fake.listener.close()
    down = PathSpec(name="office", type="proxy", scheme="socks5h", host="127.0.0.1", port=1,
                    username="e", password="e", resolves_at_exit=True)
    with pytest.raises(PathDownError) as caught:
        run(ns, check_path(down, timeout=5))
    assert str(caught.value).startswith("socks5h://127.0.0.1:1: cannot connect "
                                        "to the exit (127.0.0.1:1: ")
    assert "***" not in str(caught.value)


def test_silent_exit_times_out(exit_world):
    ns, _, _ = exit_world
    listener = listen(ns)     # accepts (backlog) but never answers
    path = PathSpec(name="mute", type="proxy", scheme="socks5h", host="127.0.0.1",
                    port=listener.getsockname()[1], resolves_at_exit=True)
    with pytest.raises(PathDownError, match="no answer"):
        run(ns, check_path(path, timeout=0.5))
    with pytest.raises(DialError) as caught:
        run(ns, dial_via(path, "example.org", 443, (), timeout=0.5))
    assert caught.value.error == "timeout"
    listener.close()


def test_direct_path(exit_world):
    # The same dial contract as the proxies', through the broker's own direct dialer.
    ns, echo, _ = exit_world
    direct = dialer_for(DIRECT)
    assert (direct.kind, direct.resolves_at_exit) == ("direct", False)
    assert run(ns, direct.check()) is None
    sock, reached = run(ns, direct.dial("localhost", echo.port, ("127.0.0.2", "127.0.0.1")))
    assert reached == "127.0.0.1"
    echo_through(sock)
    with pytest.raises(DialError) as caught:
        run(ns, direct.dial("localhost", 1, ("127.0.0.1",)))
    assert caught.value.error == "refused"
    with pytest.raises(ValueError):
        run(ns, dial_via(DIRECT, "localhost", echo.port, ("127.0.0.1",)))   # a proxy's dial only


def test_proxy_paths_have_the_same_dial_contract(exit_world):
    ns, echo, _ = exit_world
    exit_ = get_exit(exit_world, "microsocks")
    proxy = dialer_for(spec(exit_))
    assert proxy.kind == "proxy" and proxy.resolves_at_exit == spec(exit_).resolves_at_exit
    assert run(ns, proxy.check()) is None
    sock, reached = run(ns, proxy.dial("127.0.0.1", echo.port, ("127.0.0.1",)))
    echo_through(sock)
