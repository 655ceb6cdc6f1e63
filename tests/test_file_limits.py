"""The [files] table: the words (stages/config/policy.py), what they mean for one run
(stages/config/file_limits.py), and the Landlock layer on its own in a forked child."""
from __future__ import annotations

import errno
import json
import os
import re

import pytest

from stages.config.file_limits import FileLimits, Limit, expand, invoker_homes, resolve
from stages.config.policy import PolicyError, parse_policy
from stages.config.policy_tables import FileEntry, FileRules
from stages.record.events import MAX_LINE, encode, parse_line
from stages.record.check import schema_problems

HEAD = 'version = 1\n[policy]\ndefault = "allow"\n'
WHERE = re.compile(r"^agent\.toml:(\d+): .+; fix: .+")


def bad(text: str) -> list[str]:
    with pytest.raises(PolicyError) as info:
        parse_policy(text, "agent.toml")
    lines = str(info.value).splitlines()
    for line in lines:
        assert WHERE.match(line), line
    return lines


# ── the words ────────────────────────────────────────────────────────────────

def test_a_files_table_parses_with_lines():
    policy = parse_policy(HEAD + '[files]\ndeny_read = ["~/.ssh",\n  "/etc/shadow"]\n'
                          'allow_write = [".", "/tmp", "./build"]\n', "agent.toml")
    files = policy.files
    assert files.deny_read == (FileEntry("~/.ssh", 5), FileEntry("/etc/shadow", 6))
    assert [e.text for e in files.allow_write] == [".", "/tmp", "./build"]
    assert {e.line for e in files.allow_write} == {7}


def test_no_files_table_means_no_limits():
    assert parse_policy(HEAD, "agent.toml").files is None


def test_allow_write_absent_means_no_write_limit_and_empty_means_nothing_writable():
    only_deny = parse_policy(HEAD + '[files]\ndeny_read = ["~/.ssh"]\n', "a.toml").files
    assert only_deny.allow_write is None
    nothing = parse_policy(HEAD + '[files]\nallow_write = []\n', "a.toml").files
    assert nothing.allow_write == () and nothing.deny_read == ()


@pytest.mark.parametrize("entry, needle", [
    ('"ssh"', 'must be absolute or start with ~ or .'),
    ('"~root/.ssh"', "~user is not supported"),
    ('""', "the path is empty"),
    ('"/a\\tb"', "control characters"),
    ("42", "not a string"),
])
def test_bad_entries_name_line_and_fix(entry, needle):
    lines = bad(HEAD + f'[files]\n\ndeny_read = ["/ok", {entry}]\n')
    assert len(lines) == 1 and needle in lines[0]
    assert lines[0].startswith("agent.toml:6: ")


def test_bad_table_shapes():
    assert "did you mean \"deny_read\"" in bad(HEAD + '[files]\ndeny_reads = ["/x"]\n')[0]
    assert "not an array" in bad(HEAD + '[files]\nallow_write = "."\n')[0]
    assert "files is a string, not a table" in bad('files = "x"\n' + HEAD)[0]


def test_files_problems_join_the_policy_problems_in_line_order():
    lines = bad('version = 1\n[policy]\ndefault = "maybe"\n[files]\ndeny_read = ["x"]\n')
    assert [int(WHERE.match(l).group(1)) for l in lines] == [3, 5]


# ── what they mean for one run ───────────────────────────────────────────────

def test_expand():
    assert expand("~/.ssh", "/home/a", "/w") == "/home/a/.ssh"
    assert expand("~", "/home/a", "/w") == "/home/a"
    assert expand(".", "/home/a", "/w/x") == "/w/x"
    assert expand("./b/../c", "/home/a", "/w") == "/w/c"
    assert expand("../up", "/home/a", "/w/x") == "/w/up"
    assert expand("//etc//x/", "/home/a", "/w") == "/etc/x"


def rules(deny=(), write=None):
    return FileRules(tuple(FileEntry(t, n) for n, t in enumerate(deny, 10)),
                     None if write is None else tuple(FileEntry(t, n) for n, t in enumerate(write, 20)))


@pytest.fixture
def tree(tmp_path):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("secret")
    (home / ".netrc").write_text("machine x")
    (tmp_path / "real-aws").mkdir()
    (home / ".aws").symlink_to(tmp_path / "real-aws")
    (tmp_path / "work").mkdir()
    return tmp_path


def test_resolve_kinds_symlinks_and_absent(tree):
    home, work = str(tree / "home"), str(tree / "work")
    limits = resolve(rules(["~/.ssh", "~/.netrc", "~/.aws", "~/.config/gcloud"], [".", "/tmp"]),
                     "agent.toml", home=home, cwd=work)
    assert [(l.path, l.kind) for l in limits.deny_read] == [
        (f"{home}/.ssh", "dir"), (f"{home}/.netrc", "file"),
        (str(tree / "real-aws"), "dir"),            # a symlink is judged by what it names
        (f"{home}/.config/gcloud", "absent")]
    assert [l.path for l in limits.allow_write] == [work, os.path.realpath("/tmp")]
    assert limits.limits_writes


def test_sudo_hides_both_homes_but_writes_only_roots(tree):
    root_home, user_home = tree / "root-home", tree / "home"
    root_home.mkdir()
    limits = resolve(rules(["~/.ssh", "/etc/shadow"], ["~"]), "a.toml", home=str(root_home),
                     cwd=str(tree), other_homes=(str(user_home),))
    assert [l.path for l in limits.deny_read] == [f"{root_home}/.ssh", f"{user_home}/.ssh", "/etc/shadow"]
    assert [l.path for l in limits.allow_write] == [str(root_home)]


def test_invoker_homes_under_sudo():
    assert invoker_homes({"HOME": "/h"}, uid=1000) == ("/h", ())
    home, others = invoker_homes({"HOME": "/root", "SUDO_USER": "root"}, uid=0)
    assert (home, others) == ("/root", ())
    import pwd
    someone = next((p for p in pwd.getpwall() if p.pw_uid != 0 and p.pw_dir.startswith("/")
                    and p.pw_dir != "/root"), None)
    if someone:
        assert invoker_homes({"HOME": "/root", "SUDO_USER": someone.pw_name}, uid=0) \
            == ("/root", (someone.pw_dir,))


def test_resolve_refusals_name_the_line(tree):
    with pytest.raises(PolicyError) as info:
        resolve(rules(["/", "~/.ssh"], ["./missing"]), "agent.toml",
                home=str(tree / "home"), cwd=str(tree / "home" / ".ssh"))
    lines = str(info.value).splitlines()
    assert lines[0].startswith("agent.toml:10: ") and "whole file system" in lines[0]
    assert lines[1].startswith("agent.toml:11: ") and "inside the denied" in lines[1]
    assert lines[2].startswith("agent.toml:20: ") and "does not exist" in lines[2]
    assert all("; fix: " in line for line in lines)


def test_plan_drops_nested_and_absent_and_root_lifts_the_write_limit():
    limits = FileLimits(
        deny_read=(Limit("a", 1, "/h/.ssh/keys", "dir"), Limit("b", 2, "/h/.ssh", "dir"),
                   Limit("c", 3, "/h/.aws", "absent"), Limit("d", 4, "/h/.netrc", "file")),
        allow_write=(Limit(".", 5, "/w/sub", "dir"), Limit(".", 6, "/w", "dir")))
    plan = limits.to_helper(landlock_abi=7)
    assert plan.hide == (("/h/.ssh", "dir"), ("/h/.netrc", "file"))
    assert plan.writable == (("/w", "dir"),) and plan.limit_writes
    assert plan.landlock_abi == 7
    # deny_read wins: a writable path inside a hidden directory is not bound
    covered = FileLimits(deny_read=(Limit("~", 1, "/h", "dir"),),
                         allow_write=(Limit("~/p", 2, "/h/p", "dir"), Limit("/t", 3, "/t", "dir")))
    assert covered.to_helper(7).writable == (("/t", "dir"),)
    everything = FileLimits(deny_read=(), allow_write=(Limit("/", 1, "/", "dir"),))
    assert not everything.limits_writes and everything.to_helper(7).landlock_abi == 0
    assert everything.layers(7) == {"deny_read": [], "allow_write": []}


def run_start(files: dict) -> dict:
    return parse_line(encode("r-abc123", "run.start", {
        "mode": "guard", "program": "sh", "policy": "p", "policy_file": "p.toml", "via": "direct",
        "dry_run": False, "allow_unix_sockets": False, "version": "0.1.0", "record": "/r",
        "files": files}))


@pytest.mark.parametrize("count", [1, 10, 100])
def test_the_record_stays_one_valid_line_however_many_paths(count):
    limits = FileLimits(
        deny_read=tuple(Limit(f"/d{i}", i, f"/home/someone/secret-directory-{i:03}", "dir")
                        for i in range(count)),
        allow_write=tuple(Limit(f"/w{i}", i, f"/work/tree-{i:03}", "dir") for i in range(count)))
    record = limits.to_record(landlock_abi=7)
    event = run_start(record)
    assert event["fields"]["files"] == record          # never {"truncated": true}
    assert schema_problems(event) == []
    assert len(encode("r-abc123", "run.start", event["fields"])) < MAX_LINE
    listed = len(record["deny_read"]) + len(record["allow_write"])
    assert listed + record.get("unlisted", 0) == 2 * count
    assert record["layers"] == {"deny_read": ["mount"], "allow_write": ["mount", "landlock"]}


def test_a_record_without_landlock_says_so():
    limits = FileLimits(deny_read=(Limit("~/.ssh", 1, "/h/.ssh", "dir"),), allow_write=())
    record = limits.to_record(landlock_abi=0)
    assert record["layers"] == {"deny_read": ["mount"], "allow_write": ["mount"]}
    assert record["allow_write"] == [] and schema_problems(run_start(record)) == []


# ── the Landlock layer alone, in a forked child (the real kernel) ───────────

def _in_child(fn) -> dict:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            out = fn()
        except BaseException as e:  # noqa: BLE001
            out = {"raised": repr(e)}
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.waitpid(pid, 0)
    return json.loads(data)


def _attempt(fn) -> str:
    try:
        fn()
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]


def test_landlock_limits_writes_to_the_writable_paths(tmp_path):
    from stages.helper import landlock
    abi = landlock.abi_version()
    if abi == 0:
        pytest.skip("this kernel has no Landlock (the mount layer still enforces allow_write)")
    inside, outside = tmp_path / "inside", tmp_path / "outside"
    inside.mkdir()
    outside.mkdir()
    (outside / "old").write_text("keep")

    def body():
        import ctypes
        ctypes.CDLL(None).prctl(38, 1, 0, 0, 0)   # PR_SET_NO_NEW_PRIVS
        landlock.restrict_writes([[str(inside), "dir"]], abi)
        return {
            "write_inside": _attempt(lambda: (inside / "new").write_text("x")),
            "write_outside": _attempt(lambda: (outside / "new").write_text("x")),
            "truncate_outside": _attempt(lambda: open(outside / "old", "w").close()),
            "unlink_outside": _attempt(lambda: (outside / "old").unlink()),
            "mkdir_outside": _attempt(lambda: (outside / "d").mkdir()),
            "rename_out": _attempt(lambda: os.rename(inside / "new", outside / "moved")),
            "link_in": _attempt(lambda: os.link(outside / "old", inside / "hard")),
            "read_outside": _attempt(lambda: (outside / "old").read_text()),
            "dev_null": _attempt(lambda: open("/dev/null", "w").write("x")),
        }

    got = _in_child(body)
    assert got == {"write_inside": "ok", "write_outside": "EACCES", "truncate_outside": "EACCES",
                   "unlink_outside": "EACCES", "mkdir_outside": "EACCES", "rename_out": "EACCES",
                   "link_in": "EXDEV", "read_outside": "ok", "dev_null": "ok"}, got
    # Control: the same process without the ruleset may do every one of them.
    assert (outside / "old").read_text() == "keep"
    (outside / "new").write_text("x")
    os.link(outside / "old", inside / "hard")


# ── learn's drafts suggest file limits, commented out ───────────────────────

def test_the_learned_draft_suggests_files_limits_that_parse_once_uncommented():
    from stages.learner.draft import SECRET_LOCATIONS, draft_policy
    from stages.record.events import read_events
    golden = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden", "pip_guard.jsonl")
    with open(golden, "rb") as f:
        draft = draft_policy(list(read_events(f, strict=True)), "agent")
    assert parse_policy(draft, "agent.toml").files is None        # a suggestion only
    head, _, tail = draft.partition("# [files]\n")
    uncommented = head + "[files]\n" + "\n".join(line[2:] if line.startswith("# ") else line.lstrip("#")
                                                  for line in tail.splitlines())
    files = parse_policy(uncommented, "agent.toml").files
    assert tuple(e.text for e in files.deny_read) == SECRET_LOCATIONS
    assert [e.text for e in files.allow_write] == [".", "/tmp"]


# ── outside = "held" (issue 42) ──────────────────────────────────────────────

def test_outside_chooses_the_held_layer_and_other_values_are_refused_with_the_line():
    held = parse_policy(HEAD + '[files]\nallow_write = ["."]\noutside = "held"\n', "a.toml").files
    assert held.outside == "held"
    assert parse_policy(HEAD + '[files]\nallow_write = ["."]\n', "a.toml").files.outside == "read-only"
    for value in ('"hold"', "true", '"Held"'):
        lines = bad(HEAD + f'[files]\nallow_write = ["."]\noutside = {value}\n')
        assert len(lines) == 1 and lines[0].startswith("agent.toml:6: outside = "), lines
        assert '"read-only", "held"' in lines[0]


def test_under_outside_held_an_absent_allow_write_path_is_left_out_and_landlock_is_off(tree):
    home, work = str(tree / "home"), str(tree / "work")
    written = FileRules(allow_write=(FileEntry(".", 1), FileEntry("~/.claude", 2)), outside="held")
    limits = resolve(written, "agent.toml", home=home, cwd=work)
    assert [l.path for l in limits.allow_write] == [work]
    assert limits.held and limits.to_helper(landlock_abi=4).landlock_abi == 0
    with pytest.raises(PolicyError):
        resolve(written._replace(outside="read-only"), "agent.toml", home=home, cwd=work)
