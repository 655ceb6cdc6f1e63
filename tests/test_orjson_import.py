"""orjson imported with stand-ins for `inspect`, `platform` and `datetime`
(and `copy`, which dataclasses loads for asdict's deepcopy;
stages/startup/imports.py, import_orjson; docs/architecture.md "Start-up
budget", 3): vpnw loads the record's modules on its way to the recorder's
fork without inspect (ast, dis, tokenize...), platform, datetime, copy or
weakref, and
everything after sees the real modules: a dataclass without a docstring gets
the same signature as its docstring, orjson writes dataclasses, dates,
times, UUIDs and enums as before, `platform.system()` and uuid's own view
of the system are the same, and each `import` is the real module.
Control: orjson imported plainly loads them all."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from startup_support import needs_the_tricks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

AFTER = """
import dataclasses, sys, json
loaded = [name in sys.modules for name in ("inspect", "platform", "datetime", "copy", "weakref")]
@dataclasses.dataclass
class P:
    a: int
    b: str = "x"
@dataclasses.dataclass
class Box:
    items: list
box = Box([[1], {"k": [2]}])
copied = dataclasses.asdict(box)
copied["items"][0].append(9)
import orjson
import inspect, platform, datetime, enum, uuid
class Colour(enum.Enum):
    RED = "red"
moment = datetime.datetime(2026, 12, 2, 6, 30, 1, 123456, tzinfo=datetime.timezone(datetime.timedelta(hours=2)))
values = [moment, moment.date(), moment.time(), datetime.datetime(2026, 1, 2, 3, 4, 5),
          uuid.UUID("12345678-1234-5678-1234-567812345678"), Colour.RED, P(2, "y")]
print(json.dumps([loaded, P.__doc__, orjson.dumps(P(1)).decode(), inspect.__file__,
                  inspect.signature(P) is not None, orjson.dumps(values).decode(),
                  orjson.loads(orjson.dumps(values)), platform.system(), platform.__file__,
                  datetime.__file__, uuid._LINUX, type(moment).__module__,
                  [copied, box.items, dataclasses.astuple(box)]]))
"""


def _run(first: str, tmp_path) -> list:
    out = subprocess.run([sys.executable, "-c", first + "\n" + AFTER], check=True, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True)
    return json.loads(out.stdout.splitlines()[-1])


@needs_the_tricks
def test_the_records_modules_load_without_inspect_and_all_after_is_the_same(tmp_path):
    ours = _run("import stages.orchestrator.run\nfrom stages.record.events import Emitter", tmp_path)
    plain = _run("import orjson", tmp_path)
    assert plain[0] == [True] * 5             # control: orjson alone loads them all
    assert ours[0] == [False] * 5             # vpnw's way: not until something asks
    assert ours[1:] == plain[1:]              # the docstring, orjson's bytes, the real modules
    assert ours[1] == "P(a: int, b: str = 'x')" and ours[3].endswith("inspect.py")
    assert ours[5].startswith('["2026-12-02T06:30:01.123456+02:00","2026-12-02","06:30:01.123456",')
    assert '"12345678-1234-5678-1234-567812345678","red",{"a":2,"b":"y"}]' in ours[5]
    assert ours[7:12] == ["Linux", ours[8], ours[9], True, "datetime"]
    # asdict's deep copy is one (the real copy, loaded when dataclasses asks)
    assert ours[12] == [{"items": [[1, 9], {"k": [2]}]}, [[1], {"k": [2]}], [[[1], {"k": [2]}]]]
    assert ours[8].endswith("platform.py") and ours[9].endswith("datetime.py")
