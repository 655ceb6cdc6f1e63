"""The work set and the held layer's plan (stages/config/work_set.py), pure:
a file system of the test's own."""
from __future__ import annotations

from stages.config.work_set import (
    Mount, held_line, layer_plan, mount_table, runs_later, work_set,
)

HOME = "/home/me"


def test_the_start_directory_the_allow_write_paths_and_tmp_are_the_work_set():
    assert work_set("/home/me/src/p", (HOME,)) == (("/tmp", "/home/me/src/p"), ())
    assert work_set("/home/me/src/p", (HOME,), ("/srv/data",), with_files=True).paths == ("/srv/data",)


def test_root_home_and_its_ancestors_are_left_out_and_said():
    for cwd in ("/", HOME, "/home"):
        ws = work_set(cwd, (HOME,))
        assert ws.paths == ("/tmp",), cwd
        assert len(ws.left_out) == 1 and cwd in ws.left_out[0]
    assert "your home directory" in work_set(HOME, (HOME,)).left_out[0]


def test_a_path_inside_another_is_covered_by_it():
    assert work_set("/tmp/x", (HOME,)).paths == ("/tmp",)


MOUNTINFO = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
23 27 0:22 / /sys rw,relatime - sysfs sysfs rw
24 27 0:6 / /dev rw,relatime - devtmpfs devtmpfs rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
28 27 0:25 / /mnt/tools/py ro,nosuid - tmpfs tools ro
29 27 0:26 / /home rw - ext4 /dev/vdb rw
30 27 0:27 / /etc/hosts rw - ext4 /dev/vda rw
31 27 0:28 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw
32 27 0:29 / /boot/efi rw - vfat /dev/vda1 rw
33 27 0:30 / /run/user/1000 rw - tmpfs tmpfs rw
34 27 0:31 / /srv/my\\040data rw - ext4 /dev/vdc rw
"""

TREE = {
    "/": ["proc", "sys", "dev", "mnt", "home", "etc", "usr", "var", "tmp", "boot", "run", "srv",
          ("vmlinuz", False)],
    "/mnt": ["tools"], "/mnt/tools": ["py"], "/home": ["me", "you"], "/etc": [("hosts", False), "ssh"],
    "/var": ["tmp", "lib", "log"], "/boot": ["efi", "grub"], "/run": ["user", "lock"],
    "/run/user": ["1000"], "/srv": ["my data"], "/home/me": [".config", ".cache"],
}


def entries_of(d):
    return [(e, True) if isinstance(e, str) else e for e in TREE.get(d, [])]


def test_mountinfo_is_read_with_its_escapes_and_the_last_mount_at_a_point_wins():
    table = mount_table(MOUNTINFO + "40 27 0:40 / /home ro - tmpfs t ro\n")
    assert Mount("/srv/my data", "ext4", False) in table
    assert [m for m in table if m.point == "/home"] == [Mount("/home", "tmpfs", True)]


def test_a_mount_with_mounts_below_is_split_and_a_home_is_an_overlay_of_its_own():
    plan = layer_plan(mount_table(MOUNTINFO), ("/tmp", "/home/me/src"), entries_of,
                      anchors=(HOME,))
    # / is split around /proc, /sys, /dev, /mnt/tools/py, /home, /etc/hosts...
    assert "/" in plan.read_only and "/mnt" not in plan.targets
    assert {"/usr", "/var", "/etc/ssh", "/boot/grub"} <= set(plan.targets)
    assert "/etc" not in plan.targets and "/tmp" not in plan.targets     # split; the work set
    # /home is a mount of its own, split around the home, which is one overlay.
    assert "/home" in plan.read_only and HOME in plan.targets and "/home/you" in plan.targets
    # A mount with nothing below: one overlay; a file bound alone: read-only;
    # the kernel's file systems: read-only; /proc, /sys, /dev: as they are.
    assert "/boot/efi" in plan.targets and "/run/user/1000" in plan.targets
    assert "/srv/my data" in plan.targets
    assert "/etc/hosts" in plan.read_only
    assert not [t for t in plan.targets if t.startswith(("/proc", "/sys", "/dev"))]
    assert not [p for p in plan.read_only if p.startswith(("/proc", "/sys", "/dev"))]


def test_a_directory_that_does_not_fit_is_split_around_one_that_does():
    # An unprivileged user: /var is root's, /var/tmp is writable.
    fits = {"/var/tmp", HOME, "/run/user/1000", "/boot/efi"}.__contains__
    plan = layer_plan(mount_table(MOUNTINFO), ("/tmp",), entries_of, anchors=(HOME,), fits=fits)
    assert "/var" not in plan.targets and "/var/tmp" in plan.targets
    # Nothing of the user's in them: no overlay, read-only on their mount.
    assert not {"/usr", "/var/lib", "/var/log", "/home/you", "/srv/my data"} & set(plan.targets)
    assert {"/", "/home", "/srv/my data"} <= set(plan.read_only)
    assert {HOME, "/run/user/1000", "/boot/efi"} <= set(plan.targets)


def test_runs_later_names_what_runs_on_its_own():
    path_dirs = ("/home/me/.local/bin", "/usr/bin")
    cases = {
        "/home/me/.bashrc": "shell start-up", "/home/me/.ssh/rc": "shell start-up",
        "/home/me/.config/fish/config.fish": "shell start-up",
        "/home/me/.local/bin/vpnw": "vpnw", "/home/me/.local/bin/git": "PATH",
        "/home/me/.local/lib/python3.11/site-packages/x.pth": "python start-up",
        "/usr/lib/python3/dist-packages/sitecustomize.py": "python start-up",
        "/home/me/.gitconfig": "git", "/home/me/src/p/.git/hooks/pre-commit": "git",
        "/home/me/.claude/settings.json": "agent settings", "/home/me/.codex/config.toml": "agent settings",
        "/home/me/.lessfilter": "tool start-up", "/home/me/.curlrc": "tool start-up",
        "/home/me/.cache/pip/x": None, "/var/lib/x": None,
    }
    for path, why in cases.items():
        assert runs_later(path, (HOME,), path_dirs) == why, path
    assert runs_later("/opt/vpnw/lib/stages/x.py", (HOME,), (), ("/opt/vpnw",)) == "vpnw"


def test_the_line_counts_by_top_directory_and_names_what_runs_later_first():
    entries = [{"path": "/home/me/.cache/a", "runs_later": None},
               {"path": "/home/me/.cache/b", "runs_later": None},
               {"path": "/home/me/.bashrc", "runs_later": "shell start-up"},
               {"path": "/usr/lib/x", "runs_later": None}]
    line = held_line(entries, "r-1", (HOME,))
    assert line.startswith("held 4 writes outside the work set, of which would run later on its own: "
                           "~/.bashrc (shell start-up)")
    assert "(~/.cache 2, /usr 1, ~/.bashrc 1)" in line and line.endswith("see `vpnw changes r-1`")
    assert held_line([], "r-1", (HOME,)) is None
