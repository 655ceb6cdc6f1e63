"""The program's environment: which variables point which clients at the doors.

Pure: the caller's environment (and the text of the git config files, for
`core.sshCommand`) in, the program's environment and the names of the
settings left as the user had them out. The helper applies it (docs/architecture.md, "The sandbox", 5);
the orchestrator applies it first, to say in `run.start` what was kept.

Two kinds of setting:

* The doors themselves (`HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY`, both cases;
  `NO_PROXY`; `NODE_USE_ENV_PROXY`) are always ours: inside the sandbox
  nothing else is reachable, so a caller's value could only fail. Never a
  SOCKS URL in HTTP(S)_PROXY: pip, npm and Node break on it. `ALL_PROXY` is
  the HTTP door too (it tunnels any TCP port with CONNECT): httpx makes a
  transport for every proxy variable when a client is created, and a
  socks5h:// URL there needs socksio, so every httpx-based SDK failed at start;
  Chromium reads it as an HTTP proxy. The SOCKS door stays for clients told
  to use it, and for the ssh relay.
* A client's own setting (npm's, the JVM's, cargo's, git's ssh command) is set
  only when the user has not set it for that client; a value the user set is
  kept, and its name (never its value) goes into the record's `env_kept`.

Applying it twice gives the same environment, so the helper may apply it to
what the orchestrator already made.
"""
from __future__ import annotations

import os
import stat

DOOR_HTTP = "http://127.0.0.1:3128"
DOOR_SOCKS = "socks5h://127.0.0.1:1080"
NO_PROXY = "localhost,127.0.0.1,::1"
DOOR_SETTINGS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "NODE_USE_ENV_PROXY")

# The JVM reads no proxy variable; these system properties are what its URL
# stack (HttpURLConnection, java.net.http.HttpClient) and plain sockets use.
# Its default nonProxyHosts already exempt localhost and 127.*.
JVM_PROXY_OPTIONS = ("-Dhttp.proxyHost=127.0.0.1 -Dhttp.proxyPort=3128 "
                     "-Dhttps.proxyHost=127.0.0.1 -Dhttps.proxyPort=3128 "
                     "-DsocksProxyHost=127.0.0.1 -DsocksProxyPort=1080")
# (In any case of their letters, as before. No `re` here: nothing else on the
# helper's way to Ready, which applies these, needs it.)
_JVM_PROXY_WORDS = ("proxyhost", "proxyport", "proxyset", "usesystemproxies")

# ssh asks this relay for the connection; it speaks SOCKS5 to the door with the
# name unresolved, so known_hosts is checked against the name the user typed.
SSH_RELAY_MODULE = "stages.inside.ssh_proxy"

# git's settings that choose the ssh command, strongest first. A variable set
# to the empty string counts as unset (as git treats it).
_GIT_SSH_VARIABLES = ("GIT_SSH_COMMAND", "GIT_SSH")
_SHELL_PLAIN = frozenset("_@%+=:,./-")


def _sets_ssh_command_key(rest: str) -> bool:
    r"""`sshcommand` in any case of its letters, then only whitespace before
    `=`, `;`, `#` or the end (what r"sshcommand\s*(=|$|[;#])" matched with
    re.IGNORECASE)."""
    if rest[:10].lower() != "sshcommand":
        return False
    tail = rest[10:].lstrip()
    return tail == "" or tail[0] in "=;#"


def _shell_quote(text: str) -> str:
    # shlex.quote without importing shlex (start-up cost on every run): plain
    # when every character is a word character (as re's \w) or one of @%+=:,./-
    if text and all(c.isalnum() or c in _SHELL_PLAIN for c in text):
        return text
    return "'" + text.replace("'", "'\"'\"'") + "'"


def ssh_command(python: str) -> str:
    """The ssh command line git runs inside the sandbox (git runs it with sh)."""
    relay = f"{_shell_quote(python)} -I -m {SSH_RELAY_MODULE} %h %p"
    return "ssh -o " + _shell_quote(f"ProxyCommand={relay}")


def config_sets_ssh_command(text: str) -> bool:
    """Does this git config text set core.sshCommand? (Includes are not followed.)"""
    in_core = False
    for line in text.splitlines():
        rest = line.strip()
        if rest.startswith("["):
            end = rest.find("]")
            in_core = end > 0 and rest[1:end].strip().lower() == "core"
            rest = rest[end + 1:].strip() if end > 0 else ""
        if in_core and _sets_ssh_command_key(rest):
            return True
    return False


def env_sets_ssh_command(env: dict[str, str]) -> bool:
    """core.sshCommand given to git through the environment (git -c, or
    GIT_CONFIG_COUNT/KEY_n)."""
    if "core.sshcommand" in env.get("GIT_CONFIG_PARAMETERS", "").lower():
        return True
    try:
        count = int(env.get("GIT_CONFIG_COUNT", "0"))
    except ValueError:
        return False
    return any(env.get(f"GIT_CONFIG_KEY_{n}", "").lower() == "core.sshcommand"
               for n in range(min(count, 1000)))


def git_config_files(env: dict[str, str]) -> list[str]:
    """The system and global git config files git would read for this env."""
    home = env.get("HOME", "")
    xdg = env.get("XDG_CONFIG_HOME") or (os.path.join(home, ".config") if home else "")
    files = [env.get("GIT_CONFIG_SYSTEM") or "/etc/gitconfig"]
    if env.get("GIT_CONFIG_GLOBAL"):
        files.append(env["GIT_CONFIG_GLOBAL"])
    else:
        if xdg:
            files.append(os.path.join(xdg, "git", "config"))
        if home:
            files.append(os.path.join(home, ".gitconfig"))
    return files


def repository_config_files(env: dict[str, str], cwd: str) -> list[str]:
    """The config files of the repository the program starts in ($GIT_DIR, or
    the nearest .git above cwd; a worktree's .git file leads to its common
    directory), where a core.sshCommand of that repository lives."""
    git_dir = env.get("GIT_DIR")
    if not git_dir:
        here = cwd
        while True:
            candidate = os.path.join(here, ".git")
            if os.path.isdir(candidate):
                git_dir = candidate
                break
            if os.path.isfile(candidate):
                git_dir = _gitdir_from_file(candidate)
                break
            parent = os.path.dirname(here)
            if parent == here:
                return []
            here = parent
    if not git_dir:
        return []
    git_dir = os.path.join(cwd, git_dir)
    common = git_dir
    try:
        with open(os.path.join(git_dir, "commondir"), encoding="utf-8") as f:
            common = os.path.join(git_dir, f.readline().strip())
    except OSError:
        pass
    files = [os.path.join(common, "config")]
    if common != git_dir:
        files.append(os.path.join(git_dir, "config.worktree"))
    return files


def _gitdir_from_file(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            line = f.readline(4096).strip()
    except OSError:
        return None
    if not line.startswith("gitdir:"):
        return None
    return os.path.join(os.path.dirname(path), line[len("gitdir:"):].strip())


def read_git_configs(env: dict[str, str], cwd: str | None = None) -> list[str]:
    """The I/O half: the text of each git config file that exists and is a
    regular file (a FIFO named by GIT_CONFIG_GLOBAL must not hang vpnw)."""
    texts = []
    names = git_config_files(env)
    if cwd:
        names += repository_config_files(env, cwd)
    for name in names:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                texts.append(os.read(fd, 1 << 20).decode("utf-8", "replace"))
        except OSError:
            pass
        finally:
            os.close(fd)
    return texts


def _user_set(env: dict[str, str], name: str) -> str | None:
    """The spelling of `name` the user set (any case: npm reads its npm_config_
    variables case-insensitively), if any, with a non-empty value."""
    for key, value in env.items():
        if key.lower() == name.lower() and value != "":
            return key
    return None


RUN_ID_SHOWN = "r-<run id>"     # `vpnw doctor`'s VPNW_RUN: every run has its own


def program_env(env: dict[str, str], *, python: str | None,
                git_configs: list[str] | None = None,
                run_id: str | None = None) -> tuple[dict[str, str], list[str]]:
    """(the program's environment, names of client settings kept as the user set them).

    `python` is the interpreter that runs vpnw (the ssh relay runs on it inside
    the sandbox); None leaves git's ssh alone. `git_configs` are the texts of
    the git config files (read_git_configs); None means none were read.
    `run_id` becomes VPNW_RUN (None keeps the one `env` has: applied again)."""
    out = {k: v for k, v in env.items() if k.upper() not in DOOR_SETTINGS}
    # The program can tell it runs in vpnw, and in which run (a prompt, an agent's status line).
    out["VPNW"] = "1"
    if run_id is not None:
        out["VPNW_RUN"] = run_id
    for key in ("HTTP_PROXY", "HTTPS_PROXY"):
        out[key] = out[key.lower()] = DOOR_HTTP
    out["ALL_PROXY"] = out["all_proxy"] = DOOR_HTTP
    out["NO_PROXY"] = out["no_proxy"] = NO_PROXY
    out["NODE_USE_ENV_PROXY"] = "1"
    kept: list[str] = []

    # npm (and pnpm, which reads npm's config): its own proxy settings beat a
    # proxy in the user's .npmrc, which could not be reached from the sandbox.
    for name in ("npm_config_proxy", "npm_config_https_proxy"):
        spelled = _user_set(env, name)
        if spelled:
            kept.append(spelled)
        else:
            out[name] = DOOR_HTTP

    # cargo: beats an http.proxy in ~/.cargo/config.toml.
    if _user_set(env, "CARGO_HTTP_PROXY"):
        kept.append("CARGO_HTTP_PROXY")
    else:
        out["CARGO_HTTP_PROXY"] = DOOR_HTTP

    # The JVM: the user's options stay; ours are added after them unless they
    # already choose a proxy.
    java = env.get("JAVA_TOOL_OPTIONS", "")
    lowered = java.lower()
    if any(word in lowered for word in _JVM_PROXY_WORDS):
        kept.append("JAVA_TOOL_OPTIONS")
    else:
        out["JAVA_TOOL_OPTIONS"] = f"{java} {JVM_PROXY_OPTIONS}".strip()

    # git over ssh.
    chosen = [name for name in _GIT_SSH_VARIABLES if env.get(name)]
    if chosen:
        kept.extend(chosen)
    elif env_sets_ssh_command(env) or any(config_sets_ssh_command(t) for t in git_configs or ()):
        kept.append("core.sshCommand")
    elif python:
        out["GIT_SSH_COMMAND"] = ssh_command(python)
    return out, kept


def own_ssh_command_warning(env: dict[str, str], kept: list[str]) -> str | None:
    """What to tell the user whose own GIT_SSH_COMMAND (kept) has no
    ProxyCommand: git over ssh then dials directly, and the sandbox has no way
    out but the doors."""
    if "GIT_SSH_COMMAND" not in kept or "proxycommand" in env.get("GIT_SSH_COMMAND", "").lower():
        return None
    return ("warning: your own GIT_SSH_COMMAND has no ProxyCommand, so ssh (and git over ssh) "
            "cannot get out of the sandbox (\"Could not resolve hostname\"); fix: add "
            "-o 'ProxyCommand=vpnw-ssh-proxy %h %p' to it, or run with --capture")


def apply(env: dict[str, str], *, python: str | None,
          run_id: str | None = None) -> tuple[dict[str, str], list[str]]:
    """program_env with the git config files read from this machine: system,
    global, and the repository the program starts in (only when no variable
    has chosen git's ssh command already)."""
    chosen = any(env.get(name) for name in _GIT_SSH_VARIABLES)
    configs = None if chosen else read_git_configs(env, _cwd())
    return program_env(env, python=python, git_configs=configs, run_id=run_id)


def _cwd() -> str | None:
    try:
        return os.getcwd()
    except OSError:
        return None


def settings_for_doctor(python: str | None) -> list[tuple[str, str]]:
    """(variable, value) for everything vpnw sets when the user has set nothing;
    VPNW_RUN's value is each run's own id, shown as "r-<run id>"."""
    env, _ = program_env({}, python=python, run_id=RUN_ID_SHOWN)
    return sorted(env.items())
