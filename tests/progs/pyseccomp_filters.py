"""Run by tests/test_startup_imports.py: pyseccomp imported the helper's
way (a stand-in typing), then the filters made every way; with argv[1]
"typing-first" the real typing is imported before (the control). One JSON
line."""
# ruff: noqa: E402 (when each module loads is what the test looks at)
import hashlib
import json
import sys

if sys.argv[1:] == ["typing-first"]:
    __import__("typing")
from stages.helper import seccomp_rules
from stages.startup import imports

with imports._sonames_known():
    with imports._typing_for_pyseccomp():
        import pyseccomp
    typing_after_import = "typing" in sys.modules
    digests = [hashlib.sha256(seccomp_rules.filter_bpf(unix, supervised=supervised)).hexdigest()
               for unix in (False, True) for supervised in (False, True)]
import typing
print(json.dumps([typing_after_import, digests, pyseccomp.get_api() > 0, callable(typing.get_type_hints)]))
