"""Shipping: the record rendered for the log pipelines security teams run.

The event stream (stages/record/events.py) stays the one format. Everything here is a
rendering of it, pure (events in, bytes out), documented field by field in
docs/record.md:

- `outcomes`: folds a run's events into connection outcomes (open, close,
  refuse, fail), the unit both security schemas describe;
- `ocsf`: OCSF Network Activity (class 4001);
- `ecs`: Elastic Common Schema;
- `syslog`: RFC 5424 messages (event JSON behind `@cee:`), the local
  `/dev/log` format, and the framings for UDP and TCP (RFC 5426, RFC 6587);
- `transports`: the only module here that touches sockets: sends rendered
  messages to a syslog target without ever blocking.

Nothing here adds to what the record holds: every value comes from the events
(the syslog header's HOSTNAME, which the transport needs, is the machine's).
"""
from __future__ import annotations

# Names of the renderings a stream can be shipped in; "jsonl" is the record itself.
EVENT_FORMATS = ("jsonl", "ocsf", "ecs")


def stream_renderer(fmt: str):
    """A callable (event dict, raw line bytes) -> list of JSON documents (bytes,
    no newline) for `fmt`. The record itself ("jsonl") passes each line as it is;
    the security schemas render only connection outcomes."""
    if fmt == "jsonl":
        return lambda event, raw: [raw.rstrip(b"\n")]
    if fmt not in EVENT_FORMATS:
        raise ValueError(f"unknown event format {fmt!r}; one of {', '.join(EVENT_FORMATS)}")
    # Only a run (or `show`) that asks for a security schema loads it: this
    # package is imported on vpnw's start when --syslog names a target
    # (transports), where orjson and the renderings stay off.
    import orjson
    from stages.recorder.shipping.outcomes import Outcomes  # as above: only for a schema
    if fmt == "ocsf":
        from stages.recorder.shipping.ocsf import render  # the schema asked for, not both
    else:
        from stages.recorder.shipping.ecs import render  # the schema asked for, not both
    outcomes = Outcomes()

    def feed(event, raw):
        return [orjson.dumps(render(o)) for o in outcomes.feed(event)]
    return feed
