#!/opt/vpnw-venv/bin/python
"""Coverage-guided fuzzing of vpnw's parsers with atheris (libFuzzer).

    scripts/fuzz_atheris.py TARGET [--seconds N] [--corpus DIR] [-- libFuzzer args]

Targets: http, http-response, socks5, socks5-client, http-connect-client,
policy, config, record, handoff-message.

Each target feeds arbitrary bytes to one parser and accepts only its one
protocol error; any other exception is a crash (atheris prints the input and
writes it to crash-<sha1>); libFuzzer's final stats give the inputs executed. Install: pip install -e '.[fuzz]'.
"""
from __future__ import annotations

import argparse
import array
import os
import socket
import sys

import atheris

with atheris.instrument_imports():
    from stages.wire import handoff
    from stages.record import events as record
    from stages.protocols import proxy_clients as exit_clients
    from stages.broker import http_proxy, socks5
    from stages.config.paths import ConfigError, load_config
    from stages.config.policy import PolicyError, parse_policy
    from stages.record.check import check_run


def _split(fdp: atheris.FuzzedDataProvider) -> list[bytes]:
    """The input cut into up to 8 pieces, so parsers see every split point."""
    pieces = []
    for _ in range(fdp.ConsumeIntInRange(1, 8)):
        pieces.append(fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 256)))
    pieces.append(fdp.ConsumeBytes(fdp.remaining_bytes()))
    return pieces


def _drain_http(parser, pieces, eof: bool) -> None:
    events = 0
    for piece in pieces + ([None] if eof else []):
        if piece is None:
            parser.feed_eof()
        else:
            parser.feed(piece)
        while True:
            event = parser.next_event()
            events += 1
            assert events < 100_000, "the parser loops"
            if event is http_proxy.NEED_DATA or event is http_proxy.CLOSED:
                break
            if isinstance(event, http_proxy.ConnectHead):
                parser.tunnel_data()
                return


def target_http(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    eof = fdp.ConsumeBool()
    try:
        _drain_http(http_proxy.RequestParser(), _split(fdp), eof)
    except http_proxy.HttpProxyError:
        pass


def target_http_response(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    eof = fdp.ConsumeBool()
    method = fdp.PickValueInList(["GET", "HEAD", "POST", "CONNECT"])
    parser = http_proxy.ResponseParser()
    try:
        parser.expect(method)
        _drain_http(parser, _split(fdp), eof)
    except http_proxy.HttpProxyError:
        pass


def target_socks5(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    parser = socks5.Socks5Parser()
    try:
        for piece in _split(fdp):
            parser.feed(piece)
            while True:
                event = parser.next_event()
                if event is socks5.NEED_DATA:
                    break
                if isinstance(event, socks5.Greeted):
                    continue
                parser.early_data()
                return
    except socks5.Socks5Error:
        pass


def target_socks5_client(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    auth = fdp.ConsumeBool()
    client = exit_clients.Socks5Client("user", "secret") if auth else exit_clients.Socks5Client()
    client.start()
    try:
        for piece in _split(fdp):
            for event in client.receive(piece):
                if isinstance(event, exit_clients.Authenticated):
                    client.connect("example.com", 443)
                # Send carries the password to the exit, as it must; nothing else may.
                assert isinstance(event, exit_clients.Send) or "secret" not in repr(event)
            client.bytes_needed
    except exit_clients.ExitProtocolError as exc:
        assert "secret" not in str(exc)


def target_http_connect_client(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    auth = fdp.ConsumeBool()
    client = exit_clients.HttpConnectClient("user", "secret") if auth else exit_clients.HttpConnectClient()
    if fdp.ConsumeBool():
        client.probe("127.0.0.1", 3128)
    else:
        client.connect("example.com", 443)
    try:
        for piece in _split(fdp):
            for event in client.receive(piece):
                assert "secret" not in repr(event)
            client.bytes_needed
    except exit_clients.ExitProtocolError as exc:
        assert "secret" not in str(exc)


def target_policy(data: bytes) -> None:
    text = data.decode("utf-8", "replace")
    try:
        parse_policy(text, "fuzz.toml")
    except PolicyError as exc:
        assert "fuzz.toml" in str(exc)


# load_config reads a file: an in-memory one, so nothing is left behind.
_CONFIG_FD = os.memfd_create("paths.toml")
_CONFIG_FILE = f"/proc/self/fd/{_CONFIG_FD}"


def target_config(data: bytes) -> None:
    os.ftruncate(_CONFIG_FD, 0)
    os.pwrite(_CONFIG_FD, data, 0)
    try:
        config = load_config(_CONFIG_FILE, env={"VPNW_PW": "secret"})
    except ConfigError as exc:
        assert "secret" not in str(exc)
        return
    for spec in config.paths.values():
        assert "secret" not in repr(spec)


def target_record(data: bytes) -> None:
    import io
    events = list(record.read_events(io.BytesIO(data)))
    check_run(events)
    for line in data.split(b"\n")[:8]:
        try:
            record.parse_line(line)
        except record.RecordError:
            pass


_LINK = None
_SCRATCH_FD = os.memfd_create("scratch")


def _descriptors(kind: int) -> list[int]:
    """Descriptors a hostile helper might attach: none, a pipe, a Unix socket,
    a file, a listening or connected TCP socket, several at once."""
    if kind == 0:
        return []
    if kind == 1:
        r, w = os.pipe()
        os.close(w)
        return [r]
    if kind == 2:
        a, b = socket.socketpair()
        b.close()
        return [a.detach()]
    if kind == 3:
        return [os.dup(_SCRATCH_FD)]
    if kind == 4:
        s = socket.socket()
        return [s.detach()]
    if kind == 5:
        return [socket.socket(socket.AF_INET6).detach() for _ in range(2)]
    return [socket.socket(socket.AF_INET, socket.SOCK_DGRAM).detach()]


def target_handoff_message(data: bytes) -> None:
    global _LINK
    if _LINK is None:
        _LINK = handoff.link()
    helper_end, broker_end = _LINK
    fdp = atheris.FuzzedDataProvider(data)
    fds = _descriptors(fdp.ConsumeIntInRange(0, 6))
    message = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 64))
    if not message and not fds:
        return      # an empty datagram is end of stream to the broker
    before = len(os.listdir("/proc/self/fd"))
    try:
        if fds:
            helper_end.sendmsg([message], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
        else:
            helper_end.send(message)
    finally:
        for fd in fds:
            os.close(fd)
    try:
        got = handoff.receive(broker_end)
    except handoff.HandoffError:
        got = None
    if got is not None:
        got.sock.close()
    after = len(os.listdir("/proc/self/fd"))
    assert after <= before - len(fds), f"descriptor leak: {before - len(fds)} -> {after}"


TARGETS = {
    "http": target_http,
    "http-response": target_http_response,
    "socks5": target_socks5,
    "socks5-client": target_socks5_client,
    "http-connect-client": target_http_connect_client,
    "policy": target_policy,
    "config": target_config,
    "record": target_record,
    "handoff-message": target_handoff_message,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", choices=sorted(TARGETS))
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--corpus", help="a directory of inputs to start from and add to")
    args, extra = parser.parse_known_args()
    extra = [a for a in extra if a != "--"]
    libfuzzer_args = [sys.argv[0], f"-max_total_time={args.seconds}", "-rss_limit_mb=1024",
                      "-timeout=10", "-print_final_stats=1", *extra]
    if args.corpus:
        os.makedirs(args.corpus, exist_ok=True)
        libfuzzer_args.append(args.corpus)
    atheris.Setup(libfuzzer_args, TARGETS[args.target])
    atheris.Fuzz()


if __name__ == "__main__":
    main()
