"""Run by tests/test_capture.py in namespaces of its own (unshare -Urm):
the shipped resolv.conf bound over /etc/resolv.conf, what the mount table
says of it, and a bind of a source that is not a regular file. One JSON
line."""
import json
import os
import subprocess
from stages.helper import capture
subprocess.run(["mount", "--make-rprivate", "/"], check=True)
capture.bind_resolv_conf()
target = os.path.realpath("/etc/resolv.conf")
mounts = [line.split() for line in open("/proc/self/mountinfo")]
bound = [m for m in mounts if m[4] == target]
try:
    capture.bind_resolv_conf(source="/etc")
    refused = None
except OSError as e:
    refused = e.errno
print(json.dumps({"text": open("/etc/resolv.conf").read(), "root": bound[-1][3],
                  "options": bound[-1][5],
                  "refused": refused}))
