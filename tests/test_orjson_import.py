"""orjson imported with a stand-in `inspect` (stages/record/events.py,
_orjson_without_inspect; docs/architecture.md "Start-up budget", 3): vpnw
loads the record's modules on its way to the recorder's fork without
inspect (ast, dis, tokenize...), and everything after sees the real module:
a dataclass without a docstring gets the same signature as its docstring,
orjson writes dataclasses as before, and `import inspect` is the real one.
Control: orjson imported plainly loads inspect."""
from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

AFTER = """
import dataclasses, sys, json
loaded = "inspect" in sys.modules
@dataclasses.dataclass
class P:
    a: int
    b: str = "x"
import orjson
import inspect
print(json.dumps([loaded, P.__doc__, orjson.dumps(P(1)).decode(), inspect.__file__,
                  inspect.signature(P) is not None]))
"""


def _run(first: str, tmp_path) -> list:
    out = subprocess.run([sys.executable, "-c", first + "\n" + AFTER], check=True, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True)
    return json.loads(out.stdout.splitlines()[-1])


def test_the_records_modules_load_without_inspect_and_all_after_is_the_same(tmp_path):
    ours = _run("import stages.orchestrator.run\nfrom stages.record.events import Emitter", tmp_path)
    plain = _run("import orjson", tmp_path)
    assert plain[0] is True                   # control: orjson alone loads inspect
    assert ours[0] is False                   # vpnw's way: not until something asks
    assert ours[1:] == plain[1:]              # the docstring, orjson's bytes, the real module
    assert ours[1] == "P(a: int, b: str = 'x')" and ours[3].endswith("inspect.py")
