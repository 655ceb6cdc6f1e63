"""Caps the broker keeps against clients that hold its resources.

The program shares the sandbox with the doors, so a hostile or broken program
can open connections and never finish a request. Each cap bounds what that
costs the broker; HANDSHAKE_TIMEOUT (sessions.py) bounds how long each one lasts.
"""

# Connections handed over but not yet past their first request head. Beyond
# this, a new connection is refused at once (conn.fail, stage handshake), so
# stalled clients cannot pile up descriptors and memory in the broker without
# bound; connections already past the handshake are not counted.
MAX_PENDING_HANDSHAKES = 1024
