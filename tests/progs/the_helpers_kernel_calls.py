"""Run by tests/test_helper_start_cpu.py."""
# ruff: noqa: E402 (when each module loads is what the test looks at)
from stages.kernel import privileges
from stages.helper import seccomp_rules
from stages.helper.supervisor import launch
print(launch.missing())
print(seccomp_rules.libseccomp_version())
seccomp_rules.loader()
print(privileges.prctl(3))          # PR_GET_DUMPABLE
try:
    privileges.mount(None, "/nonexistent-vpnw", None, 0)
except OSError as e:
    print(e.errno)
from stages.kernel import seccomp_notify  # noqa: F401 (its calls answer as ctypes does)
import ctypes
class Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint), ("minor", ctypes.c_uint), ("micro", ctypes.c_uint)]
library = ctypes.CDLL("libseccomp.so.2")
library.seccomp_version.restype = ctypes.POINTER(Version)
v = library.seccomp_version().contents
print(((v.major, v.minor, v.micro), library.seccomp_api_get()))
