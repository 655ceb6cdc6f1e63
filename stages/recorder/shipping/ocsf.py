"""A connection outcome as OCSF Network Activity (class_uid 4001, OCSF 1.8.0).

Field by field in docs/record.md ("OCSF"). Every value comes from the record;
what the record does not know (the program's pid inside the sandbox, the
source address inside the sandbox's own loopback) is left out rather than
made up. Validated against the published schema in tests/test_shipping_schemas.py.
"""
from __future__ import annotations

from stages.recorder.shipping.outcomes import Outcome, duration_ms, epoch_ms, ip_version

OCSF_VERSION = "1.8.0"
CATEGORY_UID = 4            # Network Activity
CLASS_UID = 4001            # Network Activity
# actor comes with the host profile; action, disposition, firewall_rule and
# policy with security_control. The schema allows them only when declared.
PROFILES = ["host", "security_control"]

# outcome -> (activity_id, activity_name)
ACTIVITY = {"open": (1, "Open"), "close": (2, "Close"), "fail": (4, "Fail"), "refuse": (5, "Refuse")}
ACTION_ALLOWED, ACTION_DENIED, ACTION_OBSERVED = (1, "Allowed"), (2, "Denied"), (3, "Observed")
DISPOSITION_ALLOWED, DISPOSITION_BLOCKED = (1, "Allowed"), (2, "Blocked")
DISPOSITION_DETECTED, DISPOSITION_ERROR = (15, "Detected"), (27, "Error")
SEVERITY = {1: "Informational", 2: "Low", 3: "Medium"}
STATUS_SUCCESS, STATUS_FAILURE = (1, "Success"), (2, "Failure")
DIRECTION_OUTBOUND = 2
TCP = 6


def _endpoint(o: Outcome) -> dict | None:
    endpoint = {}
    if o.domain:
        endpoint["hostname"] = o.domain
    ip = o.ip
    if ip:
        endpoint["ip"] = ip
    if not endpoint:
        return None        # a handshake that never named a destination
    if o.connection.port is not None:
        endpoint["port"] = o.connection.port
    return endpoint


def _decision(o: Outcome):
    """(action, disposition, severity_id, status) for this outcome."""
    c = o.connection
    if o.kind == "refuse":
        return ACTION_DENIED, DISPOSITION_BLOCKED, 3, STATUS_FAILURE
    if c.would_deny:
        # Dry run: the policy would have denied it and let it through.
        action, disposition, severity = ACTION_OBSERVED, DISPOSITION_DETECTED, 2
    else:
        action, disposition, severity = ACTION_ALLOWED, DISPOSITION_ALLOWED, 1
    if o.kind == "fail":
        disposition = DISPOSITION_ERROR if not c.would_deny else disposition
        if c.rule is None and not c.would_deny:
            action = (0, "Unknown")    # failed before the policy decided (bad handshake, say)
        return action, disposition, max(severity, 2), STATUS_FAILURE
    return action, disposition, severity, STATUS_SUCCESS


def _document(o: Outcome, activity, decision) -> dict:
    """What every document has: the class, the activity, the decision, the
    metadata, and the sandbox as source and actor."""
    activity_id, activity_name = activity
    (action_id, action), (disposition_id, disposition), severity_id, (status_id, status) = decision
    run = o.run
    run_id = run.run or o.event.get("run")
    ts = o.event.get("ts") or ""
    product = {"name": "vpnw", "vendor_name": "vpnw"}
    if run.version:
        product["version"] = run.version
    doc = {
        "class_uid": CLASS_UID,
        "class_name": "Network Activity",
        "category_uid": CATEGORY_UID,
        "category_name": "Network Activity",
        "activity_id": activity_id,
        "activity_name": activity_name,
        "type_uid": CLASS_UID * 100 + activity_id,
        "type_name": f"Network Activity: {activity_name}",
        "time": epoch_ms(ts),
        "severity_id": severity_id,
        "severity": SEVERITY[severity_id],
        "action_id": action_id,
        "action": action,
        "disposition_id": disposition_id,
        "disposition": disposition,
        "status_id": status_id,
        "status": status,
        "metadata": {
            "version": OCSF_VERSION,
            "product": product,
            "profiles": list(PROFILES),
            "event_code": o.event.get("type"),
            "original_time": ts,
            "correlation_uid": run_id,
        },
    }
    # The source is the sandbox of this run (its address is the sandbox's own
    # loopback, which says nothing): named by the run id and the program.
    source = {"uid": run_id}
    if run.program:
        source["name"] = run.program
    doc["src_endpoint"] = source
    doc["actor"] = {"process": dict(source), "app_name": "vpnw"}
    if run.policy:
        doc["policy"] = {"name": run.policy}
    return doc


def render(o: Outcome) -> dict:
    if o.kind in UNIX_KINDS:
        return _unix(o)
    c, f = o.connection, o.fields
    doc = _document(o, ACTIVITY[o.kind], _decision(o))
    doc["connection_info"] = {
        "uid": f"{o.run.run or o.event.get('run')}#{c.conn}",
        "direction_id": DIRECTION_OUTBOUND,
        "direction": "Outbound",
        "protocol_name": "tcp",
        "protocol_num": TCP,
    }
    endpoint = _endpoint(o)
    if endpoint is not None:
        doc["dst_endpoint"] = endpoint
        version = ip_version(endpoint.get("ip"))
        if version:
            doc["connection_info"]["protocol_ver_id"] = version
    if c.rule:
        doc["firewall_rule"] = {"name": c.rule}
    if o.kind == "refuse" or c.would_deny or o.kind == "fail":
        reason = f.get("reason") if o.kind in ("refuse", "fail") else c.reason
        if isinstance(reason, str):
            doc["status_detail"] = reason
            doc["message"] = reason
    if o.kind == "fail" and isinstance(f.get("error"), str):
        doc["status_code"] = f["error"]
    if o.kind == "close":
        up, down = f.get("bytes_up"), f.get("bytes_down")
        if isinstance(up, int) and isinstance(down, int):
            doc["traffic"] = {"bytes_out": up, "bytes_in": down, "bytes": up + down}
        ms = duration_ms(f.get("ms"))
        if ms is not None:
            doc["duration"] = ms
            doc["end_time"] = doc["time"]
            doc["start_time"] = doc["time"] - ms
    return doc


# A connect() to a Unix socket outside the sandbox (unix.deny, unix.allow):
# Network Activity too, Refuse or Open. The socket's path is the destination's
# name (OCSF has no field for a socket path; no protocol is claimed), the
# process by its command name, its PID inside the sandbox in `unmapped`.
UNIX_KINDS = {"unix-refuse": (ACTIVITY["refuse"], (ACTION_DENIED, DISPOSITION_BLOCKED, 3, STATUS_FAILURE)),
              "unix-open": (ACTIVITY["open"], (ACTION_ALLOWED, DISPOSITION_ALLOWED, 1, STATUS_SUCCESS))}


def _unix(o: Outcome) -> dict:
    f = o.fields
    doc = _document(o, *UNIX_KINDS[o.kind])
    doc["connection_info"] = {"direction_id": DIRECTION_OUTBOUND, "direction": "Outbound"}
    path = f.get("path") if isinstance(f.get("path"), str) else "?"
    doc["dst_endpoint"] = {"name": path}
    process = doc["actor"]["process"]
    if isinstance(f.get("program"), str):
        process["name"] = f["program"]
    if isinstance(f.get("process"), int) and not isinstance(f.get("process"), bool):
        # process.namespace_pid belongs to the container profile, which
        # nothing else here is: the PID inside the sandbox goes unmapped.
        doc["unmapped"] = {"sandbox_pid": f["process"]}
    if o.kind == "unix-refuse":
        reason = f.get("reason") if isinstance(f.get("reason"), str) else "refused"
        doc["status_detail"] = reason
        doc["message"] = f"Unix socket {path}: {reason}"
    elif isinstance(f.get("rule"), str):
        doc["firewall_rule"] = {"name": f["rule"]}
        doc["message"] = f"Unix socket {path}: allowed by [unix] {f['rule']}"
    return doc


def mark_truncated(doc: dict) -> None:
    """The marker a shortened document carries (syslog.shrink)."""
    labels = doc.setdefault("metadata", {}).setdefault("labels", [])
    if "truncated" not in labels:
        labels.append("truncated")
