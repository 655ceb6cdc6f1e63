"""The supervisor's compiled path (fast_continue.c, built where a C
compiler and Python's headers were at install), or None: then the Python
one (shell.py) answers everything, as where it is turned off."""
from __future__ import annotations

import os

# Set, the Python path answers every notification, as where the compiled
# one did not build (the tests run both).
PYTHON_ONLY_ENV = "VPNW_SUPERVISOR_PYTHON"


def compiled_path():
    """The compiled fast path's module, or None (not built here, or
    PYTHON_ONLY_ENV set): then the Python path answers everything."""
    if os.environ.get(PYTHON_ONLY_ENV):
        return None
    try:
        # An extension module an install may lack: asked for, not required.
        from stages.helper.supervisor import fast_continue
    except ImportError:
        return None
    return fast_continue

