"""Ubuntu's restriction of user namespaces, and the AppArmor profile that
lifts it for vpnw alone (docs/install.md, "Ubuntu 23.10 and later").

With `kernel.apparmor_restrict_unprivileged_userns = 1` (Ubuntu 23.10 and
later) a program that no AppArmor profile allows `userns` gets a user
namespace without capabilities, and vpnw's sandbox cannot be built (122).
The peers ship a profile for their own binary (bubblewrap's for
/usr/bin/bwrap, Cursor's for its executable); vpnw writes one for itself as
installed: `vpnw doctor --apparmor-profile`, installed by root.

AppArmor attaches a profile by the path of the file exec'd; for a `#!`
script that is the script's own path, not its interpreter's. So the profile
names vpnw's launcher (the venv's `bin/vpnw`, symlinks resolved), whose
forks build the sandbox, and nothing else gets the permission: a profile on
the interpreter would free every Python program on the machine (a venv's
python is a link to the system's). `flags=(unconfined)`, as Ubuntu's own
bwrap profile: the profile adds `userns` and takes nothing away.

Pure: the profile's text and the doctor's verdict from what was read.
"""
from __future__ import annotations

import hashlib
import re

SYSCTL = "/proc/sys/kernel/apparmor_restrict_unprivileged_userns"
# The task's AppArmor label ("unconfined", or "NAME (MODE)"); the first
# where the kernel has the per-LSM directory.
LABEL_FILES = ("/proc/self/attr/apparmor/current", "/proc/self/attr/current")
PROFILE_DIR = "/etc/apparmor.d"
PROFILE_PREFIX = "vpnw-"
# Characters AppArmor reads as globbing or syntax in a path: such a path is
# refused rather than quoted into a pattern that matches more than vpnw.
_UNSAFE_PATH = re.compile(r'[*?\[\]{}^@"\\\x00-\x1f\x7f,]')


class ProfileProblem(ValueError):
    """No profile can be written for this installation; the message says why."""


def profile_name(launcher: str) -> str:
    """One name per installed launcher: installing the profile again for the
    same vpnw replaces it, another installation's stays."""
    return PROFILE_PREFIX + hashlib.sha256(launcher.encode("utf-8", "surrogateescape")).hexdigest()[:12]


def profile_text(launcher: str) -> str:
    """The profile for the launcher at `launcher` (absolute, symlinks resolved)."""
    if not launcher.startswith("/") or _UNSAFE_PATH.search(launcher):
        raise ProfileProblem(f"vpnw's launcher path {launcher!r} is not an absolute path AppArmor "
                             "can name exactly (spaces are fine; * ? [ ] { } ^ @ \" \\ , and control "
                             "characters are not): install vpnw where its path has none of them")
    name = profile_name(launcher)
    return ("# vpnw: user namespaces for its sandbox where AppArmor restricts them\n"
            "# (kernel.apparmor_restrict_unprivileged_userns = 1, Ubuntu 23.10 and later).\n"
            f"# Written by `vpnw doctor --apparmor-profile` for the vpnw at {launcher}.\n"
            "abi <abi/4.0>,\n"
            "include <tunables/global>\n"
            "\n"
            f'profile {name} "{launcher}" flags=(unconfined) {{\n'
            "  userns,\n"
            "}\n")


def install_step(user: str) -> str:
    """The one root step that installs the profile: what the README and the
    doctor's fix say."""
    where = f"{PROFILE_DIR}/{PROFILE_PREFIX}{user}"
    return (f"vpnw doctor --apparmor-profile | sudo tee {where} >/dev/null "
            f"&& sudo apparmor_parser -r {where}")


def verdict(restricted: str | None, label: str | None, user: str) -> tuple[str, str, str] | None:
    """(status, detail, fix) for the doctor, or None where AppArmor
    restricts nothing (no such sysctl, or 0)."""
    if restricted != "1":
        return None
    setting = "kernel.apparmor_restrict_unprivileged_userns = 1"
    current = (label or "").strip()
    if current.startswith(PROFILE_PREFIX):
        return ("ok", f"{setting}; vpnw runs under its AppArmor profile {current.split()[0]}, "
                      "which allows user namespaces", "")
    if current in ("", "unconfined"):
        return ("fail", f"{setting} (Ubuntu 23.10 and later) and no AppArmor profile allows vpnw "
                        "user namespaces: its sandbox cannot be built", install_step(user))
    return ("warn", f"{setting}; vpnw runs under the AppArmor profile {current}, which must allow "
                    "userns for the sandbox to be built", install_step(user))
