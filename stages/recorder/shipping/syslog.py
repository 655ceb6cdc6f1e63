"""Events as syslog messages: RFC 5424 for the network, the local format for
/dev/log, the event's JSON behind `@cee:` in both.

    <PRI>1 TIMESTAMP HOSTNAME vpnw PROCID MSGID - @cee:{...event JSON...}

- PRI: facility `user` (1, RFC 5424 table 1: user-level messages; vpnw is a
  program a user runs, not a daemon) * 8 + the severity below. Route on
  APP-NAME `vpnw` rather than on the facility.
- severity follows the event: a denial is a warning (4); a failure of vpnw
  itself (`run.end` with an `error`, a path that is down, a connection that
  failed inside vpnw) is an error (3); a connection that failed outside vpnw
  and a dry-run's "would deny" are notices (5); everything else is
  informational (6).
- TIMESTAMP: the event's own time (RFC 5424 allows 6 fractional digits; the
  record's nanoseconds are cut to microseconds).
- HOSTNAME: this machine's name (the only value not from the record: the
  transport needs it); PROCID: vpnw's pid (the orchestrator's, from run.start);
  MSGID: the record's event type; STRUCTURED-DATA: none (`-`).
- MSG: `@cee:` and the JSON document, no BOM (the cookie must come first for
  rsyslog's mmjsonparse and syslog-ng's json-parser), so MSG is RFC 5424's
  MSG-ANY: UTF-8 JSON, never a raw newline in it.

The local format (what syslog(3) writes to /dev/log, which rsyslog,
syslog-ng and journald all parse; the daemon adds the host name):

    <PRI>Mmm dd hh:mm:ss vpnw[PROCID]: @cee:{...}

Length: a message is at most `max_size` octets (default 8192, the default
maximum of rsyslog; RFC 5424 §6.1 lets a receiver cut anything above 2048,
and a receiver that cuts does so at the end, which would break the JSON).
A message that would be longer is never cut: its document is shortened
(`shrink`) until it fits, and says so. Record lines are at most 4000 bytes,
so in the record's own format this never happens at the default size.
"""
from __future__ import annotations

import socket
import time

import orjson

from stages.recorder.shipping import stream_renderer
from stages.recorder.shipping.outcomes import epoch_ms, severity

FACILITY_USER = 1
APP_NAME = "vpnw"
MAX_MESSAGE = 8192
CEE = b"@cee:"

def _header_token(text, limit: int) -> str:
    """A header field: printable US-ASCII without spaces (RFC 5424 §6), or the
    NILVALUE."""
    if not isinstance(text, str) or not text or len(text) > limit:
        return "-"
    if any(not 33 <= ord(ch) <= 126 for ch in text):
        return "-"
    return text


def rfc5424_timestamp(ts) -> str:
    """The record's `2026-09-29T11:44:36.754728731Z` as RFC 5424 TIMESTAMP
    (at most 6 fractional digits), or the NILVALUE."""
    if not isinstance(ts, str) or len(ts) < 20 or ts[10] != "T" or not ts.endswith("Z"):
        return "-"
    if len(ts) > 20 and ts[19] == ".":
        return ts[:19] + ts[19:-1][:7] + "Z"
    return ts[:19] + "Z"


def local_timestamp(ts) -> str:
    """`Mmm dd hh:mm:ss` in local time, as syslog(3) writes it."""
    secs = epoch_ms(ts) // 1000 if isinstance(ts, str) else 0
    t = time.localtime(secs or None)
    months = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
    return f"{months[t.tm_mon - 1]} {t.tm_mday:2d} {t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}"


def rfc5424_header(event: dict, *, hostname: str, procid, facility: int = FACILITY_USER) -> bytes:
    pri = facility * 8 + severity(event)
    return (f"<{pri}>1 {rfc5424_timestamp(event.get('ts'))} {_header_token(hostname, 255)} "
            f"{APP_NAME} {_header_token(str(procid) if procid else None, 128)} "
            f"{_header_token(event.get('type'), 32)} - ").encode("ascii")


def local_header(event: dict, *, procid, facility: int = FACILITY_USER) -> bytes:
    pri = facility * 8 + severity(event)
    tag = f"{APP_NAME}[{procid}]" if procid else APP_NAME
    return f"<{pri}>{local_timestamp(event.get('ts'))} {tag}: ".encode("ascii")


def _longest_string(node, parent=None, key=None, best=None):
    """(length, container, key) of the longest string in a JSON document."""
    if isinstance(node, str):
        if parent is not None and (best is None or len(node) > best[0]):
            return (len(node), parent, key)
        return best
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for k, v in items:
        best = _longest_string(v, node, k, best)
    return best


def shrink(doc: dict, budget: int, mark) -> bytes:
    """`doc` serialised in at most `budget` bytes: its longest strings are cut
    (ending in `…`, as the record cuts long fields) until it fits, and
    `mark(doc)` records that it was shortened. Returns b"" if even that
    cannot fit (a budget smaller than the document's skeleton)."""
    mark(doc)
    data = orjson.dumps(doc)
    while len(data) > budget:
        best = _longest_string(doc)
        if best is None or best[0] <= 8:
            return b""
        length, container, key = best
        excess = len(data) - budget
        # Cut by what is too much (in bytes; a character may be several), at least half.
        keep = max(4, min(length // 2, length - excess))
        container[key] = container[key][:keep] + "…"
        data = orjson.dumps(doc)
    return data


def mark_record_truncated(event: dict) -> None:
    # The record's own convention for an event too long for its line.
    event["fields"] = {"truncated": True}


class SyslogMessages:
    """Events in, syslog messages out (unframed; the transport frames them).

    `fmt` is the document in MSG: "jsonl" (the record's event), "ocsf" or
    "ecs" (connection outcomes only). `local` selects the /dev/log format."""

    def __init__(self, *, fmt: str = "jsonl", local: bool = False, hostname: str | None = None,
                 facility: int = FACILITY_USER, max_size: int = MAX_MESSAGE):
        self.fmt = fmt
        self.render = stream_renderer(fmt)
        self.local = local
        self.hostname = hostname if hostname is not None else socket.gethostname()
        self.facility = facility
        self.max_size = max_size
        self.procid = None
        self.shrunk = 0          # messages shortened to fit
        self.unfit = 0           # messages that could not be made to fit (dropped)

    def _mark(self):
        if self.fmt == "ocsf":
            from stages.recorder.shipping.ocsf import mark_truncated  # only the format asked for
            return mark_truncated
        if self.fmt == "ecs":
            from stages.recorder.shipping.ecs import mark_truncated  # only the format asked for
            return mark_truncated
        return mark_record_truncated

    def feed(self, event: dict, raw: bytes) -> list[bytes]:
        if event.get("type") == "run.start" and isinstance(event.get("pid"), int):
            self.procid = event["pid"]
        procid = self.procid or event.get("pid")
        if self.local:
            header = local_header(event, procid=procid, facility=self.facility)
        else:
            header = rfc5424_header(event, hostname=self.hostname, procid=procid,
                                    facility=self.facility)
        out = []
        for body in self.render(event, raw):
            budget = self.max_size - len(header) - len(CEE)
            if len(body) > budget:
                self.shrunk += 1
                body = shrink(orjson.loads(body), budget, self._mark())
                if not body:
                    self.unfit += 1
                    continue
            out.append(header + CEE + body)
        return out


    def chain_head(self, head: dict, ts: str) -> bytes:
        """The chain's head as a message of its own (docs/record.md, "The
        chain's head off the machine"): MSGID `vpnw.chain`, severity info,
        MSG `@cee:{"vpnw_chain": {...}}` whatever `fmt` the events carry."""
        event = {"type": "vpnw.chain", "ts": ts}
        if self.local:
            header = local_header(event, procid=self.procid, facility=self.facility)
        else:
            header = rfc5424_header(event, hostname=self.hostname, procid=self.procid,
                                    facility=self.facility)
        return header + CEE + orjson.dumps({"vpnw_chain": head})


def octet_counted(message: bytes) -> bytes:
    """RFC 6587 §3.4.1 framing for TCP: `MSG-LEN SP SYSLOG-MSG`."""
    return b"%d " % len(message) + message
