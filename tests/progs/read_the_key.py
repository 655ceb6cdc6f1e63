"""Run by tests/test_e2e_signed_end.py. Every way to read the key from inside
(the file-limits tests' ways): by name, through /proc/self/root and
/proc/1/root, relative to a cwd inside the key directory, by listing the
directory, and by walking the whole state directory for the key's bytes.
Prints {attempt: "ok:<what>" | errno}."""
import errno
import json
import os
import sys
keys, state, secret = sys.argv[1], sys.argv[2], sys.argv[3].encode()
name = os.path.join(keys, "run-signing.key")
results = {}
def attempt(label, fn):
    try:
        results[label] = "ok:" + fn()
    except OSError as e:
        results[label] = errno.errorcode.get(e.errno, str(e.errno))
def read(path):
    with open(path, "rb") as f:
        return "key" if secret in f.read() else "other"
attempt("open", lambda: read(name))
attempt("via-proc-self-root", lambda: read("/proc/self/root" + name))
attempt("via-proc-1-root", lambda: read("/proc/1/root" + name))
attempt("relative-to-cwd", lambda: read("run-signing.key"))
attempt("list-keys", lambda: ",".join(sorted(os.listdir(keys))))
attempt("list-cwd", lambda: ",".join(sorted(os.listdir("."))))
def walk():
    found = []
    for top, _dirs, files in os.walk(state):
        for f in files:
            try:
                if read(os.path.join(top, f)) == "key":
                    found.append(f)
            except OSError:
                pass
    return ",".join(found)
attempt("walk-state", walk)
def raw_device():
    # The key's bytes straight from the block device its file system lives on.
    st = os.stat(state)
    with open(f"/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}", "rb") as f:
        return "device:%d" % len(f.read(4096))
attempt("raw-device", raw_device)
print(json.dumps(results))
