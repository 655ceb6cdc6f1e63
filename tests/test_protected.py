"""stages/config/protected.py: what the program may not change, computed from
home, the installation, cwd, the config and allow_write, over a file system
the test describes (the look-ups are the function's only contact with one)."""
from __future__ import annotations

import os

from stages.config import protected as pr
from stages.config.paths import ConfigFiles, config_files, load_config


class FakeFs:
    """path -> "dir" | "file" (with text); symlinks as `links` (path -> target)."""

    def __init__(self, entries: dict[str, str], texts: dict[str, str] = None, links=None):
        self.entries = dict(entries)
        self.texts = texts or {}
        self.links = links or {}

    def real(self, path: str) -> str:
        path = os.path.normpath(path)
        for link, target in self.links.items():
            if path == link or path.startswith(link + "/"):
                return target + path[len(link):]
        return path

    def locate(self, path: str):
        real = self.real(path)
        return real, self.entries.get(real, "absent")

    def read_text(self, path: str):
        return self.texts.get(self.real(path))


HOME = "/home/me"
BASE = {HOME: "dir", f"{HOME}/.bashrc": "file", f"{HOME}/.profile": "file",
        f"{HOME}/.ssh": "dir", f"{HOME}/.ssh/config": "file", f"{HOME}/.config": "dir",
        f"{HOME}/.config/systemd": "dir", f"{HOME}/.config/systemd/user": "dir",
        f"{HOME}/.gitconfig": "file", "/etc/hosts": "file", "/etc/resolv.conf": "file",
        f"{HOME}/src": "dir", f"{HOME}/src/app": "dir", f"{HOME}/src/app/.git": "dir",
        f"{HOME}/src/app/.git/hooks": "dir", f"{HOME}/src/app/.git/config": "file",
        f"{HOME}/src/app/lib": "dir",
        f"{HOME}/.local/share/vpnw-venv": "dir", "/usr/bin/python3.11": "file",
        "/usr/lib/python3.11": "dir"}


def protect(fs: FakeFs, list_dir=None, **kw) -> pr.Protection:
    inputs = pr.Inputs(**{"homes": (HOME,), "cwd": f"{HOME}/src/app/lib", **kw})
    return pr.protect(inputs, fs.locate, fs.read_text, list_dir)


def paths(entries) -> set[str]:
    return {e.path for e in entries}


def test_start_up_files_git_and_the_name_look_ups_are_read_only_absent_ones_listed():
    p = protect(FakeFs(BASE))
    ro = paths(p.read_only)
    assert {f"{HOME}/.bashrc", f"{HOME}/.profile", f"{HOME}/.ssh/config", f"{HOME}/.gitconfig",
            f"{HOME}/.config/systemd", "/etc/hosts", "/etc/resolv.conf",
            # git looks upward from the working directory: the repository above cwd
            f"{HOME}/src/app/.git/hooks", f"{HOME}/src/app/.git/config"} <= ro
    # a file that is not there cannot be bound: it is checked after the run
    assert {f"{HOME}/.bash_profile", f"{HOME}/.zshrc", f"{HOME}/.config/autostart",
            f"{HOME}/.ssh/authorized_keys"} <= paths(p.absent)
    assert not ro & paths(p.absent)
    assert p.hidden == () and p.lifted == ()


def test_the_installation_is_read_only_one_bind_per_tree():
    venv = f"{HOME}/.local/share/vpnw-venv"
    install = pr.installation("/usr/bin/python3.11", [f"{venv}/lib/python3.11/site-packages",
                                                      "/usr/lib/python3.11", "/usr/lib/python311.zip"],
                              venv, "/usr", f"{venv}/lib/python3.11/site-packages/stages",
                              f"{venv}/bin/vpnw")
    fs = FakeFs({**BASE, f"{venv}/lib/python3.11/site-packages": "dir",
                 f"{venv}/lib/python3.11/site-packages/stages": "dir", f"{venv}/bin/vpnw": "file"})
    p = protect(fs, install=install)
    ro = paths(p.read_only)
    # the venv's whole prefix (pyvenv.cfg names the interpreter), once: nothing inside it again
    assert venv in ro and not any(r.startswith(venv + "/") for r in ro)
    assert {"/usr/bin/python3.11", "/usr/lib/python3.11"} <= ro
    assert "/usr/lib/python311.zip" in paths(p.absent)


def test_a_system_install_protects_its_import_dirs_not_the_whole_prefix():
    install = pr.installation("/usr/bin/python3.11", ["/usr/lib/python3.11"], "/usr", "/usr",
                              "/usr/lib/python3/dist-packages/stages", None)
    assert "/usr" not in install
    assert "/usr/lib/python3/dist-packages/stages" in install


def test_secret_files_are_hidden_not_read_only_and_named_files_read_only():
    fs = FakeFs({**BASE, "/cfg": "dir", "/cfg/office.conf": "file", "/cfg/office.pass": "file",
                 "/cfg/ca.pem": "file"})
    p = protect(fs, secrets=("/cfg/office.conf", "/cfg/office.pass", "/cfg/gone.key"),
                named=("/cfg/ca.pem",), evidence=("/cfg",))
    assert paths(p.hidden) == {"/cfg/office.conf", "/cfg/office.pass"}
    assert {h.kind for h in p.hidden} == {"file"}
    assert "/cfg" in paths(p.read_only)
    assert not paths(p.hidden) & paths(p.read_only)


def test_only_naming_the_very_path_in_allow_write_lifts_it():
    wide = protect(FakeFs(BASE), allow_write=(HOME, f"{HOME}/src/app"),
                   writable_trees=(HOME, f"{HOME}/src/app"))
    assert f"{HOME}/.bashrc" in paths(wide.read_only) and wide.lifted == ()
    named = protect(FakeFs(BASE), allow_write=(f"{HOME}/.bashrc",))
    assert paths(named.lifted) == {f"{HOME}/.bashrc"}
    assert f"{HOME}/.bashrc" not in paths(named.read_only)


def test_symlinks_are_judged_by_what_they_name():
    fs = FakeFs({**BASE, "/data/dots": "dir", "/data/dots/bashrc": "file"},
                links={f"{HOME}/.bashrc": "/data/dots/bashrc"})
    assert "/data/dots/bashrc" in paths(protect(fs).read_only)


def test_writable_trees_get_their_project_start_up_files_and_repositories():
    fs = FakeFs({**BASE, "/work": "dir", "/work/.vscode": "dir", "/work/.git": "file",
                 "/repos/w.git/worktrees/work": "dir", "/repos/w.git": "dir",
                 "/repos/w.git/hooks": "dir", "/repos/w.git/config": "file"},
                texts={"/work/.git": "gitdir: /repos/w.git/worktrees/work\n",
                       "/repos/w.git/worktrees/work/commondir": "../..\n"})
    p = protect(fs, writable_trees=("/work",))
    ro = paths(p.read_only)
    assert {"/work/.vscode", "/repos/w.git/hooks", "/repos/w.git/config"} <= ro
    # absent, a project's start-up files are not watched: projects gain them legitimately
    assert not any(a.path.startswith("/work/") for a in p.absent)


def test_sudo_protects_both_homes():
    fs = FakeFs({**BASE, "/root": "dir", "/root/.bashrc": "file"})
    p = pr.protect(pr.Inputs(homes=("/root", HOME), cwd="/tmp"), fs.locate, fs.read_text)
    assert {"/root/.bashrc", f"{HOME}/.bashrc"} <= paths(p.read_only)


def test_the_record_lists_what_fits_and_counts_the_rest():
    fs = FakeFs(BASE)
    p = protect(fs)
    full = p.to_record()
    assert set(full) == {"hidden", "lifted", "read_only", "absent"}
    small = p.to_record(budget=40)
    listed = sum(len(v) for k, v in small.items() if k != "unlisted")
    assert small["unlisted"] + listed == sum(len(v) for v in full.values())


def test_every_path_of_a_config_names_its_secrets(tmp_path):
    key = "YWJjZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXoxMjM0NTY="
    (tmp_path / "office.conf").write_text(
        f"[Interface]\nPrivateKey = {key}\nAddress = 10.9.0.2/32\n[Peer]\nPublicKey = {key}\n"
        "Endpoint = 192.0.2.1:51820\nAllowedIPs = 0.0.0.0/0\n")
    (tmp_path / "paths.toml").write_text(
        'version = 1\nname = "t"\n'
        '[paths.a]\ntype = "proxy"\nurl = "socks5h://127.0.0.1:1080"\nusername = "u"\n'
        'password_env = "A_PASSWORD"\n'
        '[paths.b]\ntype = "proxy"\nurl = "http://127.0.0.1:3128"\nusername = "u"\n'
        'password_file = "b.pass"\n'
        '[paths.wg]\ntype = "wireguard"\nconf = "office.conf"\n')
    named = config_files(load_config(str(tmp_path / "paths.toml")))
    assert named.secret_vars == ("A_PASSWORD",)
    assert set(named.secret_files) == {str(tmp_path / "b.pass"), str(tmp_path / "office.conf")}
    assert config_files(None) == ConfigFiles()


class FakeTree(FakeFs):
    """FakeFs with directory listings, for the scan below the work set."""

    def list_dir(self, path: str):
        path = self.real(path)
        if self.entries.get(path) != "dir":
            return None
        return [(os.path.basename(p), kind) for p, kind in self.entries.items()
                if os.path.dirname(p) == path and p != path]


REPO = f"{HOME}/src/app/.git"


def test_every_place_git_reads_config_and_hooks_from_is_protected():
    fs = FakeTree({**BASE, f"{REPO}/config.worktree": "file", f"{REPO}/info": "dir",
                   f"{REPO}/info/attributes": "file", f"{REPO}/modules": "dir",
                   f"{REPO}/modules/lib": "dir", f"{REPO}/modules/lib/x": "dir",
                   f"{REPO}/modules/lib/x/HEAD": "file", f"{REPO}/modules/lib/x/config": "file",
                   f"{REPO}/modules/lib/x/hooks": "dir",
                   f"{HOME}/src/app/.husky": "dir", f"{HOME}/src/app/.husky/_": "dir",
                   f"{HOME}/shared.gitconfig": "file"},
                  texts={f"{REPO}/config": '[core]\n\thooksPath = ".husky/_" ; husky\n'
                                           '[includeIf "gitdir:~/src/"]\n\tpath = ~/shared.gitconfig\n',
                         f"{HOME}/.gitconfig": "[core]\n\thooksPath = ~/hooks\n"})
    p = protect(fs, list_dir=fs.list_dir)
    ro = paths(p.read_only)
    assert {f"{REPO}/config.worktree", f"{REPO}/info/attributes", f"{REPO}/modules/lib/x/config",
            f"{REPO}/modules/lib/x/hooks", f"{HOME}/src/app/.husky/_",
            f"{HOME}/shared.gitconfig"} <= ro
    # not there at the start: a new commondir, a global hooks folder, checked after the run
    assert {f"{REPO}/commondir", f"{HOME}/hooks"} <= paths(p.absent)
    assert f"{REPO}/modules/lib/x" in p.repositories


def test_a_commondir_at_the_start_protects_the_common_directory_it_names():
    fs = FakeTree({**BASE, f"{REPO}/commondir": "file", "/shared": "dir", "/shared/config": "file",
                   "/shared/hooks": "dir"}, texts={f"{REPO}/commondir": "/shared\n"})
    ro = paths(protect(fs, list_dir=fs.list_dir).read_only)
    assert {f"{REPO}/commondir", "/shared/config", "/shared/hooks"} <= ro


def test_repositories_below_the_start_directory_are_found_to_the_scan_depth():
    fs = FakeTree({**BASE, "/w": "dir", "/w/a": "dir", "/w/a/.git": "dir", "/w/a/.git/config": "file",
                   "/w/a/b": "dir", "/w/a/b/c": "dir", "/w/a/b/c/.git": "dir",
                   "/w/a/b/c/d": "dir", "/w/a/b/c/d/.git": "dir",
                   "/w/node_modules": "dir", "/w/node_modules/x": "dir", "/w/node_modules/x/.git": "dir"})
    p = pr.protect(pr.Inputs(homes=(HOME,), cwd="/w"), fs.locate, fs.read_text, fs.list_dir)
    assert set(p.repositories) == {"/w/a/.git", "/w/a/b/c/.git"}
    assert "/w/a/.git/config" in paths(p.read_only)
    # a home is too wide to walk: only the repository it is in
    at_home = pr.protect(pr.Inputs(homes=(HOME,), cwd=HOME), fs.locate, fs.read_text, fs.list_dir)
    assert at_home.repositories == () and at_home.scan_cut == ()


def test_a_scan_past_its_budget_says_where(monkeypatch):
    entries = {**BASE, "/w": "dir", **{f"/w/d{i}": "dir" for i in range(50)}}
    fs = FakeTree(entries)
    monkeypatch.setattr(pr, "SCAN_BUDGET", 10)
    p = pr.protect(pr.Inputs(homes=(HOME,), cwd="/w"), fs.locate, fs.read_text, fs.list_dir)
    assert p.scan_cut == ("/w",)


def test_git_config_entries_and_what_runs_in_a_new_repository():
    text = ('[Core]\n\tFSMonitor = "echo hi # not a comment"  # a comment\n'
            '[alias]\n\tco = checkout\n[credential "https://x"]\n\thelper = store\n')
    assert pr.git_config_entries(text) == [("core", "fsmonitor", "echo hi # not a comment"),
                                           ("alias", "co", "checkout"),
                                           ("credential", "helper", "store")]
    fs = FakeTree({"/n/.git": "dir", "/n/.git/hooks": "dir", "/n/.git/hooks/pre-commit": "file",
                   "/n/.git/hooks/pre-push.sample": "file", "/n/.git/config": "file"},
                  texts={"/n/.git/config": text})
    assert pr.active_start_up("/n/.git", fs.list_dir, fs.read_text) == [
        "hooks/pre-commit", "core.fsmonitor", "credential.helper"]


def test_the_pins_are_every_directory_above_up_to_the_root():
    from stages.helper.pins import ancestors_to_pin
    got = ancestors_to_pin([f"{HOME}/src/app/.git/hooks", f"{HOME}/.ssh/config", "/etc/hosts"],
                           ["/", HOME + "/src"])
    # outermost first; /home/me/src is a mount point already (the work set's
    # root): not bound again, but the walk goes on above it (a rename of
    # /home/me would carry it along)
    assert got == ["/etc", "/home", HOME, f"{HOME}/.ssh", f"{HOME}/src/app", f"{HOME}/src/app/.git"]
    assert ancestors_to_pin([f"{HOME}/.bashrc"], ["/", HOME]) == ["/home"]


def test_a_policy_in_a_folder_found_replaced_is_refused_until_put_back(tmp_path):
    from stages.orchestrator import replaced as rp
    pol = tmp_path / "pol"
    pol.mkdir()
    (pol / "p.toml").write_text("")
    st = pol.stat()
    state = tmp_path / "state"
    rp.remember(str(state), {str(pol): ((1, 2), (st.st_dev, st.st_ino))}, "r-1")
    assert "refused" in rp.refusal(str(state), str(pol / "p.toml"), "--policy")
    assert rp.refusal(str(state), str(tmp_path / "other.toml"), "--policy") is None
    # the person's own back at the name: another inode, loaded again
    (tmp_path / "kept").mkdir()       # made while pol is there: another inode
    (pol / "p.toml").unlink()
    pol.rmdir()
    (tmp_path / "kept").rename(pol)
    assert pol.stat().st_ino != st.st_ino
    assert rp.refusal(str(state), str(pol / "p.toml"), "--policy") is None


def test_read_small_reads_regular_files_only_and_never_blocks(tmp_path):
    """After a run the files are the program's: a FIFO named `.git/config`
    must not hold vpnw (an open for reading waits for a writer)."""
    fifo = tmp_path / "config"
    os.mkfifo(fifo)
    assert pr.read_small(str(fifo)) is None
    (tmp_path / "commondir").write_text("../..\n")
    assert pr.read_small(str(tmp_path / "commondir")) == "../..\n"
    assert pr.read_small(str(tmp_path)) is None


def test_a_linked_worktrees_commondir_and_config_worktree_are_protected():
    """`git worktree add ../w2` keeps the new worktree's git directory under
    the repository's own (.git/worktrees/w2): its `commondir`, rewritten,
    would move the config the person's next git command there reads."""
    wt = f"{REPO}/worktrees/w2"
    fs = FakeTree({**BASE, f"{REPO}/worktrees": "dir", wt: "dir", f"{wt}/commondir": "file",
                   f"{wt}/gitdir": "file", f"{wt}/HEAD": "file"},
                  texts={f"{wt}/commondir": "../..\n", f"{wt}/gitdir": "/elsewhere/w2/.git\n"})
    p = protect(fs, list_dir=fs.list_dir)
    assert f"{wt}/commondir" in paths(p.read_only)
    assert f"{wt}/config.worktree" in paths(p.absent)
    assert wt in p.repositories


def test_an_agents_new_settings_are_judged_by_whether_they_name_a_command():
    texts = {"/h/.claude/settings.json": '{"theme": "dark", "permissions": {"allow": []}}',
             "/h/.claude/settings.local.json": '{"hooks": {"SessionStart": []}}',
             "/h/.codex/config.toml": '[projects."/w"]\ntrust_level = "trusted"\n',
             "/h/.codex/other/config.toml": 'model = "o3"\n[profiles.x]\nnotify = ["sh", "-c", "x"]\n',
             "/h/.gemini/settings.json": '{"selectedAuthType": "oauth", "x": [{"env": {}}]}',
             "/h/bad.json": "{not json"}
    judge = lambda p: pr.new_agent_settings_run_commands(p, texts.get)   # noqa: E731
    assert not judge("/h/.claude/settings.json") and not judge("/h/.codex/config.toml")
    assert judge("/h/.claude/settings.local.json") and judge("/h/.codex/other/config.toml")
    assert judge("/h/.gemini/settings.json")       # nested: at any depth
    assert judge("/h/bad.json") and judge("/h/missing.json") and judge("/h/.aider.conf.yml")
