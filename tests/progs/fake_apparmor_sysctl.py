"""Run by tests/test_apparmor.py."""
import ctypes
import os
import sys
libc = ctypes.CDLL(None, use_errno=True)
MS_BIND, MS_REC = 4096, 16384

def mount(source, target, kind, flags):
    if libc.mount(source.encode(), target.encode(), kind and kind.encode(), flags, None) != 0:
        sys.exit(f"mount {target}: " + os.strerror(ctypes.get_errno()))

# The kernel's sysctls as they are, then a tmpfs over them holding each of
# them again (bound) and the one file of ours.
real = "/mnt"       # a directory every Debian has, covered in this mount namespace only
mount("/proc/sys/kernel", real, None, MS_BIND | MS_REC)
mount("none", "/proc/sys/kernel", "tmpfs", 0)
for name in os.listdir(real):
    target = os.path.join("/proc/sys/kernel", name)
    if os.path.isdir(os.path.join(real, name)):
        os.mkdir(target)
    else:
        open(target, "w").close()
    mount(os.path.join(real, name), target, None, MS_BIND | MS_REC)
with open("/proc/sys/kernel/apparmor_restrict_unprivileged_userns", "w") as f:
    f.write(sys.argv[1] + "\n")
libc.prctl(47, 4, 0, 0, 0)     # PR_CAP_AMBIENT_CLEAR_ALL: the doctor runs with none of them
os.execv(sys.argv[2], sys.argv[2:])
