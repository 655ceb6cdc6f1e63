"""What the HTTP door says itself rather than pass on: a short error
answer, the 403 of a refusal (the DENY line's words, X-Vpnw-Deny,
Proxy-Status), and CONNECT's 200. The connection closes after an error."""
from __future__ import annotations

from stages.broker.http_heads import BAD_VALUE

def error_response(status: int, reason: str, *, deny_reason: str | None = None) -> bytes:
    """A short answer from the proxy itself; the connection closes after it."""
    titles = {400: "Bad Request", 403: "Forbidden", 408: "Request Timeout",
              414: "URI Too Long", 431: "Request Header Fields Too Large",
              501: "Not Implemented", 502: "Bad Gateway", 504: "Gateway Timeout",
              505: "HTTP Version Not Supported"}
    body = f"vpnw: {reason}\n".encode("utf-8", "replace")
    lines = [f"HTTP/1.1 {status} {titles.get(status, 'Error')}".encode(),
             b"Content-Type: text/plain; charset=utf-8",
             b"Content-Length: " + str(len(body)).encode(),
             b"Connection: close"]
    if deny_reason is not None:
        lines.append(b"X-Vpnw-Deny: " + header_safe(deny_reason))
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def denied_response(denied) -> bytes:
    """The 403 of a refusal (connector.Denied), at the HTTP door and to a
    captured plain-HTTP request alike: the body is the DENY line's words
    (`vpnw: evil.example:443 denied: REASON`), the reason again in
    X-Vpnw-Deny, and Proxy-Status (RFC 9209) names vpnw."""
    body = (denied.text() + "\n").encode("utf-8", "replace")
    # The reason phrase carries the words too: clients that show no body of
    # a refused CONNECT print it (Python's http.client, so requests and pip:
    # "Tunnel connection failed: 403 vpnw: evil.example:443 denied: ...").
    lines = [b"HTTP/1.1 403 " + header_safe(denied.text()),
             b"Content-Type: text/plain; charset=utf-8",
             b"Content-Length: " + str(len(body)).encode(),
             b"Connection: close",
             b"Proxy-Status: vpnw; error=destination_ip_prohibited" if denied.rule == "machine" else
             b"Proxy-Status: vpnw; error=http_request_denied",
             b"X-Vpnw-Deny: " + header_safe(denied.reason)]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def header_safe(text: str) -> bytes:
    """A reason sentence as a header value: ASCII, no control characters."""
    raw = text.encode("ascii", "replace")
    return BAD_VALUE.sub(b" ", raw)[:400]


CONNECT_OK = b"HTTP/1.1 200 Connection established\r\n\r\n"
