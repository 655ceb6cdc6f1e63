"""stages/startup/records.py: the run's records behave as the dataclasses they
replaced (construction, defaults, equality, hash, repr, replace, frozen),
so Policy, PathSpec, Config and RunRequest mean what they meant. With the
start-up tricks off (VPNW_STARTUP_TRICKS=off) they are those dataclasses,
and the same tests hold (only the words of a TypeError differ)."""
from __future__ import annotations

import dataclasses

import pytest

from stages.config.paths import DIRECT, PathSpec, SecretSource
from stages.config.policy import Policy, load_policy
from stages.startup.records import Factory, FrozenRecord, NamedTuple, Record


class Spec(FrozenRecord):
    _uncompared = ("note",)
    _unshown = ("secret",)
    name: str
    port: int | None = None
    secret: str | None = None
    note: str = ""


@dataclasses.dataclass(frozen=True)
class SpecAsDataclass:
    name: str
    port: int | None = None
    secret: str | None = dataclasses.field(default=None, repr=False)
    note: str = dataclasses.field(default="", compare=False)


@pytest.mark.parametrize("args, kwargs", [(("a",), {}), (("a", 1), {"secret": "s"}),
                                          ((), {"name": "b", "note": "n", "port": 2})])
def test_a_frozen_record_is_what_the_frozen_dataclass_was(args, kwargs):
    record, data = Spec(*args, **kwargs), SpecAsDataclass(*args, **kwargs)
    assert repr(record) == repr(data).replace("SpecAsDataclass", "Spec")
    assert hash(record) == hash(Spec(*args, **kwargs))
    assert record == Spec(*args, **{**kwargs, "note": "other"}) == record.replace(note="x")
    assert record != Spec(*args, **{**kwargs, "secret": "other"})
    assert record.replace(port=99).port == 99 and record.port != 99
    with pytest.raises(AttributeError):
        record.name = "changed"
    with pytest.raises(AttributeError):
        del record.name


def test_a_record_refuses_a_missing_or_unknown_field():
    with pytest.raises(TypeError, match="needs name|required positional argument: 'name'"):
        Spec()
    with pytest.raises(TypeError, match="no field colour|unexpected keyword argument 'colour'"):
        Spec("a", colour="red")
    with pytest.raises(TypeError):
        Spec("a", 1, None, "", "one too many")


def test_a_factory_default_is_made_for_each_record():
    class Bag(Record):
        items: list = Factory(list)
    one, two = Bag(), Bag()
    one.items.append(1)
    assert two.items == [] and one != two
    one.items = []           # a plain Record can be changed, as a dataclass
    assert one == two
    with pytest.raises(TypeError):
        hash(one)


def test_the_policy_and_the_paths_compare_as_before(tmp_path):
    text = 'version = 1\n[policy]\nallow = ["example.com", "10.0.0.0/8"]\n'
    (tmp_path / "a.toml").write_text(text)
    (tmp_path / "b.toml").write_text(text + "\n# another file, the same policy\n")
    a, b = load_policy(str(tmp_path / "a.toml")), load_policy(str(tmp_path / "b.toml"))
    assert a.sha256 != b.sha256 and a.source != b.source
    assert a.replace(source=b.source, name=b.name) == b            # sha256 and the indexes are not compared
    assert a.allow_index.match_name("example.com", 443) is not None    # __post_init__ made it
    assert "allow_index" not in repr(a) and "example.com" in repr(a)
    assert Policy.allow_all() == Policy.allow_all()
    spec = PathSpec(name="p", type="proxy", scheme="socks5", host="h", port=1, password="pw",
                    secret=SecretSource("env", "X", None))
    assert "pw" not in repr(spec) and "secret" not in repr(spec)
    assert spec == spec.replace(secret=None) != spec.replace(password="other")
    assert DIRECT == PathSpec(name="direct", type="direct") and hash(DIRECT) == hash(DIRECT.replace())


def test_named_tuple_is_typings_without_typing():
    import pickle
    import typing

    class Mine(NamedTuple):
        """a doc"""
        x: int
        y: str = "d"

        def twice(self):
            return self.x * 2

    class Typings(typing.NamedTuple):
        x: int
        y: str = "d"

    mine, theirs = Mine(1), Typings(1)
    assert (mine, repr(mine)[4:], mine._fields, mine._field_defaults) == \
        (theirs, repr(theirs)[7:], theirs._fields, theirs._field_defaults)
    assert mine.twice() == 2 and Mine.__doc__ == "a doc" and mine._replace(y="e") == (1, "e")
    assert Mine.__module__ == __name__
    with pytest.raises(TypeError):
        Mine()
    from stages.config.host_rules import Rule
    rule = Rule("example.com", "name", 443, 3, host="example.com")
    assert pickle.loads(pickle.dumps(rule)) == rule and rule.network is None
    with pytest.raises(TypeError, match="follows one with a default|cannot follow default field"):
        class Bad(NamedTuple):
            a: int = 1
            b: int
