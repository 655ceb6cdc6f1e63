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

from progs_support import PROGS
from startup_support import needs_the_tricks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(way: str, tmp_path) -> list:
    """tests/progs/orjson_way.py's line: `way` "vpnw" (the record's modules
    imported as vpnw does) or "plain" (orjson alone)."""
    out = subprocess.run([sys.executable, str(PROGS / "orjson_way.py"), way], check=True, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": ROOT, "PYTHONDONTWRITEBYTECODE": "1"},
                         capture_output=True, text=True)
    return json.loads(out.stdout.splitlines()[-1])


@needs_the_tricks
def test_the_records_modules_load_without_inspect_and_all_after_is_the_same(tmp_path):
    ours = _run("vpnw", tmp_path)
    plain = _run("plain", tmp_path)
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
