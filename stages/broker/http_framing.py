"""The body-reading half of the HTTP door's parsers (http_proxy.py), shared
by requests and responses: where a parser is in its stream (the states
below), the head taken off the buffer, and the body passed on byte for
byte, by Content-Length, chunked (its framing included), or until the
origin closes. Sans-I/O: bytes in, events out (`Body`, `END`, `NEED_DATA`).
"""
from __future__ import annotations

from stages.broker.http_heads import (
    BAD_VALUE, HEX, MAX_BODY_EVENT, MAX_CHUNK_LINE, MAX_HEADERS, MAX_HEADERS_BYTES, Body,
    HttpProxyError, parse_headers,
)
from stages.broker.sans_io import NEED_DATA, Sentinel

END = Sentinel("END")          # the message (its head and body) is complete
CLOSED = Sentinel("CLOSED")    # the client closed cleanly between requests


# Where a parser is in its stream. The transitions:
#   IDLE  -expect()->  HEAD                      (responses only: one per request)
#   HEAD  -a head->    BODY_START[framing]      (CONNECT: TUNNEL; a 1xx: HEAD again)
#   LENGTH / CHUNKED  -the last byte->  DONE     UNTIL_CLOSE  -end of stream->  STREAM_CLOSED
#   DONE  -END->       _AFTER_MESSAGE            (a request: HEAD; a response: IDLE)
#   HEAD  -end of stream between messages->  STREAM_CLOSED
IDLE = Sentinel("IDLE")                    # no response is due
HEAD = Sentinel("HEAD")                    # reading a message head
LENGTH = Sentinel("LENGTH")                # a body of Content-Length bytes
CHUNKED = Sentinel("CHUNKED")              # a chunked body
UNTIL_CLOSE = Sentinel("UNTIL_CLOSE")      # a response body that ends when the origin closes
DONE = Sentinel("DONE")                    # the message ended; END is due
TUNNEL = Sentinel("TUNNEL")                # after CONNECT: no HTTP any more
STREAM_CLOSED = Sentinel("STREAM_CLOSED")  # the stream ended where a message may end

# Framing (from body_framing) -> the state that reads that body.
BODY_START = {"none": DONE, "length": LENGTH, "chunked": CHUNKED, "close": UNTIL_CLOSE}

# Inside a chunked body.
CHUNK_SIZE = Sentinel("CHUNK_SIZE")
CHUNK_DATA = Sentinel("CHUNK_DATA")
CHUNK_DATA_END = Sentinel("CHUNK_DATA_END")   # the line end after a chunk's data
TRAILER = Sentinel("TRAILER")


class Framer:
    """The body-reading half shared by requests and responses."""
    _AFTER_MESSAGE: Sentinel    # where a subclass goes after a message's END

    def __init__(self):
        self._buf = bytearray()
        self._mode = HEAD          # one of the states above
        self._left = 0             # bytes left of the body or current chunk
        self._chunk_state = CHUNK_SIZE
        self._eof = False

    def feed(self, data: bytes) -> None:
        if self._eof:
            raise HttpProxyError("data after end of stream")
        self._buf += data

    def feed_eof(self) -> None:
        self._eof = True

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def raw_body_ahead(self) -> int:
        """How many of the bytes that come next in the stream are body data
        the parser need not see: the rest of a Content-Length body or of the
        current chunk's data, when nothing is buffered. The I/O shell may
        move them itself (os.splice) and then call `raw_body_passed`; 0 when
        the next bytes must be fed (a head, a chunk-size line, a trailer)."""
        if self._buf or self._eof:
            return 0
        if self._mode is LENGTH or (self._mode is CHUNKED and self._chunk_state is CHUNK_DATA):
            return self._left
        return 0

    def raw_body_passed(self, n: int) -> None:
        """n of the bytes `raw_body_ahead` offered went on without the parser."""
        if not 0 < n <= self.raw_body_ahead():
            raise ValueError("more body passed than was ahead")
        self._left -= n
        if self._left == 0:
            if self._mode is LENGTH:
                self._mode = DONE
            else:
                self._chunk_state = CHUNK_DATA_END

    def _take_head(self, first_line_cap: int) -> bytes | None:
        buf = self._buf
        if not buf:
            return None
        # The head ends at the first blank line: "\r\n\r\n", or with bare LF
        # line ends "\n\n" or "\n\r\n". The usual CRLF end is found first;
        # the others only matter where they start before it.
        crlf = buf.find(b"\r\n\r\n")
        limit = len(buf) if crlf < 0 else crlf + 2
        ends = [(crlf, 4)] if crlf >= 0 else []
        end = buf.find(b"\n\n", 0, limit + 1)
        if end >= 0:
            ends.append((end, 2))
        mixed = buf.find(b"\n\r\n", 0, limit + 2)
        if mixed >= 0:
            ends.append((mixed, 3))
        if not ends:
            first_nl = self._buf.find(b"\n")
            if first_nl < 0 and len(self._buf) > first_line_cap:
                raise HttpProxyError("first line too long", 414)
            if first_nl > first_line_cap:
                raise HttpProxyError("first line too long", 414)
            if len(self._buf) > first_line_cap + MAX_HEADERS_BYTES:
                raise HttpProxyError("headers too large", 431)
            if self._eof and self._buf:
                raise HttpProxyError("stream ended inside a head")
            return None
        pos, width = min(ends)
        head = bytes(self._buf[:pos])
        if len(head) > first_line_cap + MAX_HEADERS_BYTES:
            raise HttpProxyError("headers too large", 431)
        del self._buf[:pos + width]
        return head

    def _body_event(self):
        if self._mode is LENGTH:
            if not self._buf:
                if self._eof:
                    raise HttpProxyError("stream ended inside a body")
                return NEED_DATA
            n = min(self._left, len(self._buf), MAX_BODY_EVENT)
            data = bytes(self._buf[:n])
            del self._buf[:n]
            self._left -= n
            if self._left == 0:
                self._mode = DONE
            return Body(data)
        if self._mode is UNTIL_CLOSE:
            if self._buf:
                n = min(len(self._buf), MAX_BODY_EVENT)
                data = bytes(self._buf[:n])
                del self._buf[:n]
                return Body(data)
            if self._eof:
                self._mode = STREAM_CLOSED
                return END
            return NEED_DATA
        return self._chunked_event()

    def _chunked_event(self):
        # Chunks pass through verbatim; parsing only finds where the body ends.
        out = bytearray()
        while len(out) < MAX_BODY_EVENT:
            if self._chunk_state is CHUNK_SIZE:
                nl = self._buf.find(b"\n")
                if nl < 0:
                    if len(self._buf) > MAX_CHUNK_LINE:
                        raise HttpProxyError("chunk size line too long")
                    break
                if nl > MAX_CHUNK_LINE:
                    raise HttpProxyError("chunk size line too long")
                line = bytes(self._buf[:nl])
                stripped = line[:-1] if line.endswith(b"\r") else line
                size = stripped.split(b";", 1)[0].strip(b" \t")
                if not HEX.match(size) or BAD_VALUE.search(stripped):
                    raise HttpProxyError("malformed chunk size")
                out += self._buf[:nl + 1]
                del self._buf[:nl + 1]
                self._left = int(size, 16)
                self._chunk_state = CHUNK_DATA if self._left else TRAILER
                self._trailer_bytes = 0
            elif self._chunk_state is CHUNK_DATA:
                if not self._buf:
                    break
                n = min(self._left, len(self._buf), MAX_BODY_EVENT - len(out))
                out += self._buf[:n]
                del self._buf[:n]
                self._left -= n
                if self._left == 0:
                    self._chunk_state = CHUNK_DATA_END
                if not n:
                    break
            elif self._chunk_state is CHUNK_DATA_END:
                if self._buf[:2] == b"\r\n":
                    out += b"\r\n"
                    del self._buf[:2]
                elif self._buf[:1] == b"\n":
                    out += b"\n"
                    del self._buf[:1]
                elif len(self._buf) >= 2 or (self._buf and self._buf[:1] != b"\r"):
                    raise HttpProxyError("chunk not followed by a line end")
                else:
                    break
                self._chunk_state = CHUNK_SIZE
            else:  # trailer lines until an empty one
                nl = self._buf.find(b"\n")
                if nl < 0:
                    if self._trailer_bytes + len(self._buf) > MAX_HEADERS_BYTES:
                        raise HttpProxyError("trailers too large", 431)
                    break
                line = bytes(self._buf[:nl + 1])
                del self._buf[:nl + 1]
                out += line
                self._trailer_bytes += len(line)
                if self._trailer_bytes > MAX_HEADERS_BYTES:
                    raise HttpProxyError("trailers too large", 431)
                body = line.rstrip(b"\n")
                body = body[:-1] if body.endswith(b"\r") else body
                if b"\r" in body:
                    raise HttpProxyError("bare CR in a trailer")
                if not body:
                    self._mode = DONE
                    break
                parse_headers([body], MAX_HEADERS)
        if out:
            return Body(bytes(out))
        if self._mode is DONE:
            return END
        if self._eof:
            raise HttpProxyError("stream ended inside a chunked body")
        return NEED_DATA

