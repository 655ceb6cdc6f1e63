"""The program's environment (stages/config/client_env.py): the doors always; each
client's own setting unless the user set it, and then its name is reported."""
from __future__ import annotations

import shlex
import subprocess

import pytest

from stages.config.client_env import (
    DOOR_HTTP, JVM_PROXY_OPTIONS, apply, config_sets_ssh_command, env_sets_ssh_command,
    git_config_files, program_env, ssh_command,
)

PY = "/opt/vpnw venv/bin/python3"   # a space on purpose: the command is run by a shell


def test_nothing_set_gives_every_client_the_doors():
    env, kept = program_env({"PATH": "/bin"}, python=PY)
    assert kept == []
    assert env["npm_config_proxy"] == env["npm_config_https_proxy"] == DOOR_HTTP
    assert env["CARGO_HTTP_PROXY"] == DOOR_HTTP
    assert env["JAVA_TOOL_OPTIONS"] == JVM_PROXY_OPTIONS
    assert "-Dhttps.proxyHost=127.0.0.1" in JVM_PROXY_OPTIONS and "-DsocksProxyPort=1080" in JVM_PROXY_OPTIONS
    assert env["GIT_SSH_COMMAND"] == ssh_command(PY)
    # ALL_PROXY is the HTTP door too: httpx needs socksio for a socks5h:// URL
    # there, and Chromium reads it as an HTTP proxy (README, "Clients").
    assert env["ALL_PROXY"] == env["all_proxy"] == DOOR_HTTP
    assert not any(v.startswith("socks") for k, v in env.items() if k.upper().endswith("_PROXY"))
    assert env["PATH"] == "/bin"


def test_the_ssh_command_survives_two_shells():
    # git runs GIT_SSH_COMMAND with sh; ssh runs ProxyCommand with sh again.
    argv = shlex.split(ssh_command(PY))
    assert argv[:2] == ["ssh", "-o"]
    option = argv[2]
    assert option.startswith("ProxyCommand=")
    assert shlex.split(option[len("ProxyCommand="):]) == [PY, "-I", "-m", "stages.inside.ssh_proxy", "%h", "%p"]
    out = subprocess.run(["sh", "-c", f"set -- {ssh_command(PY)}; printf '%s\\n' \"$@\""],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == argv


@pytest.mark.parametrize("name,value", [
    ("npm_config_proxy", "http://corp:8080"),
    ("NPM_CONFIG_PROXY", "http://corp:8080"),      # npm reads these in any case
    ("npm_config_https_proxy", "http://corp:8443"),
    ("CARGO_HTTP_PROXY", "http://corp:3128"),
    ("GIT_SSH_COMMAND", "ssh -i ~/.ssh/deploy"),
    ("GIT_SSH", "/usr/local/bin/my-ssh"),
])
def test_a_client_setting_the_user_made_is_kept_and_named(name, value):
    env, kept = program_env({name: value}, python=PY)
    assert env[name] == value
    assert kept == [name]


def test_the_door_settings_are_always_ours():
    user = {"HTTPS_PROXY": "socks5://evil:1", "Http_Proxy": "http://corp:1", "no_proxy": "*",
            "NODE_USE_ENV_PROXY": "0", "all_proxy": "socks5://corp:1080"}
    env, kept = program_env(user, python=PY)
    assert kept == []
    assert "Http_Proxy" not in env
    assert env["HTTPS_PROXY"] == env["http_proxy"] == DOOR_HTTP
    assert env["no_proxy"] == "localhost,127.0.0.1,::1" and env["NODE_USE_ENV_PROXY"] == "1"
    assert env["all_proxy"] == DOOR_HTTP


def test_an_empty_value_is_unset():
    env, kept = program_env({"GIT_SSH_COMMAND": "", "npm_config_proxy": ""}, python=PY)
    assert kept == [] and env["GIT_SSH_COMMAND"] == ssh_command(PY)
    assert env["npm_config_proxy"] == DOOR_HTTP


def test_java_options_of_the_user_stay_and_ours_follow():
    env, kept = program_env({"JAVA_TOOL_OPTIONS": "-Xmx2g"}, python=PY)
    assert env["JAVA_TOOL_OPTIONS"] == f"-Xmx2g {JVM_PROXY_OPTIONS}" and kept == []
    env, kept = program_env({"JAVA_TOOL_OPTIONS": "-Dhttps.proxyHost=corp"}, python=PY)
    assert env["JAVA_TOOL_OPTIONS"] == "-Dhttps.proxyHost=corp" and kept == ["JAVA_TOOL_OPTIONS"]


@pytest.mark.parametrize("text,sets", [
    ("[core]\n\tsshCommand = ssh -i k\n", True),
    ("[user]\n\tname = a\n[Core]\n  SSHCOMMAND=ssh\n", True),
    ("[core] sshcommand = ssh\n", True),
    ("[core]\n\teditor = vi\n[alias]\n\tsshCommand = x\n", False),
    ('[core "x"]\n\tsshCommand = ssh\n', False),
    ("[core]\n\tsshCommandX = 1\n\t# sshCommand = ssh\n", False),
    ("", False),
])
def test_core_sshcommand_in_a_config_file(text, sets):
    assert config_sets_ssh_command(text) is sets


def test_core_sshcommand_keeps_gits_ssh_alone():
    env, kept = program_env({}, python=PY, git_configs=["[core]\n\tsshCommand = ssh -i k\n"])
    assert "GIT_SSH_COMMAND" not in env and kept == ["core.sshCommand"]
    for given in ({"GIT_CONFIG_PARAMETERS": "'core.sshCommand'='ssh -i k'"},
                  {"GIT_CONFIG_COUNT": "2", "GIT_CONFIG_KEY_0": "user.name",
                   "GIT_CONFIG_KEY_1": "core.sshCommand"}):
        assert env_sets_ssh_command(given)
        env, kept = program_env(given, python=PY)
        assert "GIT_SSH_COMMAND" not in env and kept == ["core.sshCommand"]
    assert not env_sets_ssh_command({"GIT_CONFIG_COUNT": "junk", "GIT_CONFIG_KEY_0": "core.sshCommand"})


def test_no_interpreter_leaves_git_alone():
    env, kept = program_env({}, python=None)
    assert "GIT_SSH_COMMAND" not in env and kept == []


def test_applying_twice_changes_nothing():
    user = {"JAVA_TOOL_OPTIONS": "-Xmx1g", "npm_config_proxy": "http://corp:1", "PATH": "/bin"}
    once, _ = program_env(user, python=PY)
    twice, _ = program_env(once, python=PY)
    assert twice == once


def test_git_config_files_follow_gits_variables(tmp_path):
    assert git_config_files({"HOME": "/h"}) == ["/etc/gitconfig", "/h/.config/git/config", "/h/.gitconfig"]
    assert git_config_files({"HOME": "/h", "XDG_CONFIG_HOME": "/x", "GIT_CONFIG_SYSTEM": "/s"}) == [
        "/s", "/x/git/config", "/h/.gitconfig"]
    assert git_config_files({"HOME": "/h", "GIT_CONFIG_GLOBAL": "/g"}) == ["/etc/gitconfig", "/g"]
    (tmp_path / ".gitconfig").write_text("[core]\n\tsshCommand = ssh -i k\n")
    env, kept = apply({"HOME": str(tmp_path), "GIT_CONFIG_SYSTEM": "/dev/null"}, python=PY)
    assert "GIT_SSH_COMMAND" not in env and kept == ["core.sshCommand"]
    env, kept = apply({"HOME": str(tmp_path / "none"), "GIT_CONFIG_SYSTEM": "/dev/null"}, python=PY)
    assert env["GIT_SSH_COMMAND"] == ssh_command(PY) and kept == []


def test_a_fifo_for_a_git_config_does_not_hang(tmp_path):
    import os
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    env, kept = apply({"HOME": str(tmp_path), "GIT_CONFIG_GLOBAL": str(fifo),
                       "GIT_CONFIG_SYSTEM": "/dev/null"}, python=PY)
    assert env["GIT_SSH_COMMAND"] == ssh_command(PY) and kept == []


def test_the_starting_repository_core_sshcommand_is_seen(tmp_path, monkeypatch):
    import subprocess as sp
    repo = tmp_path / "repo"
    sp.run(["git", "init", "-q", str(repo)], check=True)
    sp.run(["git", "-C", str(repo), "config", "core.sshCommand", "ssh -i deploy"], check=True)
    (repo / "sub").mkdir()
    base = {"HOME": str(tmp_path / "home"), "GIT_CONFIG_SYSTEM": "/dev/null"}
    monkeypatch.chdir(repo / "sub")
    env, kept = apply(base, python=PY)
    assert "GIT_SSH_COMMAND" not in env and kept == ["core.sshCommand"]
    # A linked worktree: its .git file leads to the common directory's config.
    sp.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
            "--allow-empty", "-m", "x"], check=True)
    sp.run(["git", "-C", str(repo), "worktree", "add", "-q", str(tmp_path / "wt")], check=True)
    monkeypatch.chdir(tmp_path / "wt")
    assert apply(base, python=PY)[1] == ["core.sshCommand"]
    # GIT_DIR names the repository; elsewhere, nothing is found.
    monkeypatch.chdir(tmp_path)
    assert apply(base, python=PY)[1] == []
    assert apply({**base, "GIT_DIR": str(repo / ".git")}, python=PY)[1] == ["core.sshCommand"]


def test_the_program_can_tell_it_runs_in_vpnw_and_in_which_run():
    env, _ = program_env({"VPNW_RUN": "r-outer"}, python=None, run_id="r-123abc")
    assert env["VPNW"] == "1" and env["VPNW_RUN"] == "r-123abc"
    again, _ = program_env(env, python=None)     # the helper applies it again: unchanged
    assert again == env


def test_an_own_ssh_command_without_proxycommand_is_warned_about():
    from stages.config.client_env import own_ssh_command_warning
    env = {"GIT_SSH_COMMAND": "ssh -i deploy"}
    _, kept = program_env(env, python=PY)
    assert "ProxyCommand=vpnw-ssh-proxy %h %p" in own_ssh_command_warning(env, kept)
    env = {"GIT_SSH_COMMAND": "ssh -o ProxyCommand='vpnw-ssh-proxy %h %p'"}
    assert own_ssh_command_warning(env, program_env(env, python=PY)[1]) is None
    assert own_ssh_command_warning({}, program_env({}, python=PY)[1]) is None
