"""Run by tests/test_orjson_import.py: the record's modules imported vpnw's
way (argv[1] "vpnw") or orjson imported plainly (the control, "plain"),
then what comes after must see the real modules. One JSON line."""
# ruff: noqa: E402 (when each module loads is what the test looks at)
import sys

if sys.argv[1] == "vpnw":
    __import__("stages.orchestrator.run")
    __import__("stages.record.events")
else:
    __import__("orjson")
import dataclasses
import json
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
import datetime
import enum
import inspect
import platform
import uuid
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
