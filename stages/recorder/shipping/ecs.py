"""A connection outcome in the Elastic Common Schema (ECS 9.x field set).

Field by field in docs/record.md ("ECS"). Every value comes from the record;
tests/test_shipping_schemas.py checks every field name, type and allowed value
against ECS's own field definitions.
"""
from __future__ import annotations

from stages.recorder.shipping.outcomes import Outcome, duration_ms, ip_version
from stages.recorder.shipping.outcomes import severity as syslog_severity

ECS_VERSION = "9.4.0"

# outcome -> (event.type, event.outcome, event.action)
TYPES = {
    "open": (["connection", "start", "allowed"], "success", "connection-opened"),
    "close": (["connection", "end", "allowed"], "success", "connection-closed"),
    "refuse": (["connection", "denied"], "failure", "connection-denied"),
    "fail": (["connection", "start"], "failure", "connection-failed"),
}
# event.severity is the syslog severity of the record event (RFC 5424, as
# --syslog sends it); log.level its name.
LEVELS = {0: "emergency", 1: "alert", 2: "critical", 3: "error", 4: "warning", 5: "notice",
          6: "info", 7: "debug"}


def render(o: Outcome) -> dict:
    if o.kind in UNIX_TYPES:
        return _unix(o)
    types, outcome, action = TYPES[o.kind]
    c, run, f = o.connection, o.run, o.fields
    severity = syslog_severity(o.event)
    level = LEVELS[severity]
    run_id = run.run or o.event.get("run")
    event = {
        "kind": "event",
        "category": ["network"],
        "type": list(types),
        "outcome": outcome,
        "action": action,
        "code": o.event.get("type"),
        "module": "vpnw",
        "dataset": "vpnw.connection",
        "provider": "vpnw",
        "severity": severity,
    }
    doc = {
        "@timestamp": o.event.get("ts"),
        "ecs": {"version": ECS_VERSION},
        "event": event,
        "log": {"level": level},
        "network": {"transport": "tcp", "direction": "egress"},
        "observer": {"product": "vpnw", "vendor": "vpnw", "type": "proxy"},
        "process": {"entity_id": run_id},
        "labels": {"vpnw_run": run_id, "vpnw_conn": str(c.conn)},
    }
    if run.version:
        doc["observer"]["version"] = run.version
    if run.program:
        doc["process"]["name"] = run.program
    if o.event.get("path"):
        doc["labels"]["vpnw_path"] = o.event["path"]
    destination = {}
    related = {}
    if c.host:
        destination["address"] = c.host
    if o.domain:
        destination["domain"] = o.domain
        related["hosts"] = [o.domain]
    ip = o.ip
    if ip:
        destination["ip"] = ip
        related["ip"] = [ip]
        doc["network"]["type"] = f"ipv{ip_version(ip)}"
    if destination and c.port is not None:
        destination["port"] = c.port
    if c.would_deny:
        # Dry run: allowed, but the policy would have denied it.
        doc["tags"] = ["would-deny"]
    if c.rule:
        doc["rule"] = {"name": c.rule}
        if run.policy:
            doc["rule"]["ruleset"] = run.policy
    reason = f.get("reason") if o.kind in ("refuse", "fail") else (c.reason if c.would_deny else None)
    if isinstance(reason, str):
        event["reason"] = reason
    if o.kind == "fail" and isinstance(f.get("error"), str):
        doc["error"] = {"code": f["error"]}
        if isinstance(reason, str):
            doc["error"]["message"] = reason
    if o.kind == "close":
        _closed(o, doc, event, destination)
    if destination:
        doc["destination"] = destination
    if related:
        doc["related"] = related
    return doc


def _closed(o: Outcome, doc: dict, event: dict, destination: dict) -> None:
    """A close's bytes each way and its duration, where the record has them."""
    f = o.fields
    up, down = f.get("bytes_up"), f.get("bytes_down")
    if isinstance(up, int) and isinstance(down, int):
        doc["source"] = {"bytes": up}
        destination["bytes"] = down
        doc["network"]["bytes"] = up + down
    ms = duration_ms(f.get("ms"))
    if ms is not None:
        event["duration"] = ms * 1_000_000      # nanoseconds
        if o.connection.opened_ts:
            event["start"] = o.connection.opened_ts
        event["end"] = o.event.get("ts")


# A connect() to a Unix socket outside the sandbox (unix.deny, unix.allow):
# ECS's destination.address takes a Unix socket as it is; process.vpid is
# the PID inside the sandbox.
UNIX_TYPES = {"unix-refuse": (["connection", "denied"], "failure", "unix-socket-denied"),
              "unix-open": (["connection", "start", "allowed"], "success", "unix-socket-allowed")}


def _unix(o: Outcome) -> dict:
    types, outcome, action = UNIX_TYPES[o.kind]
    f, run = o.fields, o.run
    severity = syslog_severity(o.event)
    run_id = run.run or o.event.get("run")
    event = {"kind": "event", "category": ["network"], "type": list(types), "outcome": outcome,
             "action": action, "code": o.event.get("type"), "module": "vpnw",
             "dataset": "vpnw.unix", "provider": "vpnw", "severity": severity}
    doc = {
        "@timestamp": o.event.get("ts"),
        "ecs": {"version": ECS_VERSION},
        "event": event,
        "log": {"level": LEVELS[severity]},
        "network": {"direction": "egress"},
        "observer": {"product": "vpnw", "vendor": "vpnw", "type": "proxy"},
        "process": {"entity_id": run_id},
        "labels": {"vpnw_run": run_id},
        "destination": {"address": f["path"] if isinstance(f.get("path"), str) else "?"},
    }
    if run.version:
        doc["observer"]["version"] = run.version
    name = f.get("program") if isinstance(f.get("program"), str) else run.program
    if name:
        doc["process"]["name"] = name
    if isinstance(f.get("process"), int) and not isinstance(f.get("process"), bool):
        doc["process"]["vpid"] = f["process"]
    if o.event.get("path"):
        doc["labels"]["vpnw_path"] = o.event["path"]
    if isinstance(f.get("reason"), str):
        event["reason"] = f["reason"]
    if isinstance(f.get("rule"), str):
        doc["rule"] = {"name": f["rule"], **({"ruleset": run.policy} if run.policy else {})}
    return doc


def mark_truncated(doc: dict) -> None:
    """The marker a shortened document carries (syslog.shrink)."""
    tags = doc.setdefault("tags", [])
    if "truncated" not in tags:
        tags.append("truncated")
