"""Unix sockets whose server runs commands outside the sandbox for whoever
connects: a terminal multiplexer's server, a container engine, the D-Bus
buses (systemd starts units on request), an X11 display (it types into every
window), an editor's or a terminal's remote-control server, an ssh
connection's master. A program handed one of these has left the sandbox,
so vpnw never suggests naming one in `[unix] allow` (the closing hints, the
learner's draft) and says why it stays refused (docs/security.md, "Unix
sockets").

Pure: a socket's address as `unix.deny` records it (a path as the program
gave it, or `@name` for an abstract socket) in, a few words naming its
server (or None) out. The list is by name, so a server started on a socket
of the user's own naming is not recognised; what it misses is a hint
that stays silent, never a socket let through (the sandbox refuses every
socket the policy does not name).
"""
from __future__ import annotations

import re

# (pattern on the address, what serves it); the first match wins. Compiled
# on first use: the recorder imports this as it starts, and most runs never ask.
_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"(^|/)tmux-\d+/[^/]+$", "tmux's server"),
    (r"(^|/)(var/)?run/screens?/S-[^/]+/[^/]+$|(^|/)\.screen/[^/]+$|(^|/)screens/S-[^/]+/[^/]+$",
     "GNU screen's session"),
    (r"(^|/)zellij(-\d+)?/", "Zellij's server"),
    (r"(^|/)(docker|dockerd)\.sock$|(^|/)docker/[^/]*\.sock$", "the Docker daemon"),
    (r"(^|/)podman(/[^/]*)?\.sock$|(^|/)podman/[^/]+\.sock$", "Podman's service"),
    (r"(^|/)containerd(/[^/]*)?\.sock$|(^|/)buildkitd?\.sock$", "containerd"),
    (r"(^|/)(lxd|incus)/(unix\.socket|[^/]*\.sock)$", "LXD's daemon"),
    (r"(^|/)libvirt/[^/]*sock[^/]*$", "libvirt's daemon"),
    (r"^/(var/)?run/user/\d+/bus$|^@?/tmp/dbus-[^/]+$|(^|/)dbus/system_bus_socket$",
     "a D-Bus bus (systemd starts commands on request)"),
    (r"^/(var/)?run/(user/\d+/)?systemd/private$", "systemd's manager"),
    (r"^@?/tmp/\.X11-unix/X\d+$", "an X11 display (it can type into every window)"),
    (r"(^|/)emacs\d*/[^/]+$", "an Emacs server (emacsclient --eval runs code)"),
    (r"(^|/)nvim[^/]*/[^/]+$|(^|/)nvim\.\d+\.\d+$", "a Neovim server"),
    (r"(^|/)kitty[^/]*$", "kitty's remote control"),
    (r"(^|/)wezterm/[^/]*sock[^/]*$|(^|/)gui-sock-\d+$", "WezTerm's mux"),
    (r"(^|/)vscode-ipc-[^/]+\.sock$", "VS Code's terminal"),
    (r"(^|/)supervisor(d)?\.sock$", "supervisord"),
    (r"(^|/)\.pm2/(rpc|pub)\.sock$", "pm2's daemon"),
    (r"(^|/)\.ssh/[^/]*(cm|control|ctl|mux|master)[^/]*$|(^|/)ssh-(mux|control)[^/]*$",
     "an ssh connection's master (new sessions and tunnels past vpnw)"),
)
_compiled: list = []


def command_server(address: str) -> str | None:
    """What serves `address` if its server runs commands for whoever
    connects (words for a sentence: "tmux's server"), else None."""
    if not isinstance(address, str):
        return None
    if not _compiled:
        _compiled.extend((re.compile(pattern), what) for pattern, what in _PATTERNS)
    for pattern, what in _compiled:
        if pattern.search(address):
            return what
    return None
