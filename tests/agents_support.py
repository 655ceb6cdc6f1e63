"""What the agents' tests (tests/test_agents.py) and their benchmark
(scripts/bench_agents.py) share: where scripts/setup put the agents, the
world's answers for the agents' own hosts, and a real terminal to run an
interactive agent in (a private tmux server)."""
from __future__ import annotations

import itertools
import json
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from world import DEFAULT_NAMES

AGENTS = Path(os.environ.get("VPNW_AGENTS", "/opt/vpnw-agents"))
CODEX = AGENTS / "node_modules" / ".bin" / "codex"
CLAUDE = AGENTS / "node_modules" / ".bin" / "claude"
COPILOT = AGENTS / "node_modules" / ".bin" / "copilot"
GEMINI = AGENTS / "node_modules" / ".bin" / "gemini"
OPENCODE = AGENTS / "node_modules" / ".bin" / "opencode"
AIDER = AGENTS / "aider" / "bin" / "aider"
# The OpenAI and Anthropic Python SDKs and litellm, in a venv of their own.
SDKS_PYTHON = AGENTS / "sdks" / "bin" / "python"
CHROMIUM = shutil.which("chromium")
PROGS = Path(__file__).resolve().parent / "progs"
VPNW = str(Path(sys.executable).parent / "vpnw")

# The agents' hosts, answered by the world's web server (addresses that look
# public; they exist only inside the test's namespaces).
AGENT_NAMES = {
    "api.anthropic.com": ["160.79.104.10"],
    "platform.claude.com": ["160.79.104.11"],
    "statsig.anthropic.com": ["160.79.104.12"],
    "chatgpt.com": ["104.18.33.45"],
    "ab.chatgpt.com": ["104.18.33.46"],
    "api.openai.com": ["104.18.33.47"],
    "raw.githubusercontent.com": ["185.199.108.133"],
    "pypi.org": ["151.101.0.223"],
    "generativelanguage.googleapis.com": ["142.250.74.10"],
    "play.googleapis.com": ["142.250.74.11"],
    "models.opencode.ai": ["104.21.80.10"],
    "registry.npmjs.org": ["104.16.1.34"],
}
# What the stand-in API hosts answer a POST (tests/world_servers/http_server.py):
# a key with no account behind it, refused at once, as the real services do.
# Without an answer (a 404) Gemini CLI and opencode retry for minutes.
_NOT_A_KEY = {"status": 400, "json": {"error": {"code": 400, "status": "INVALID_ARGUMENT",
                                                "message": "API key not valid. Please pass a valid API key."}}}
STAND_IN_ANSWERS = {
    # Gemini CLI 0.61.0: its model router, then the model it routes to.
    "/v1beta/models/gemini-3.5-flash-lite:generateContent": _NOT_A_KEY,
    "/v1beta/models/gemini-3.1-pro-preview:streamGenerateContent": _NOT_A_KEY,
    # opencode with the OpenAI provider: the Responses API.
    "/v1/responses": {"status": 401, "json": {"error": {
        "message": "Incorrect API key provided: sk-vpnw-test.", "type": "invalid_request_error",
        "param": None, "code": "invalid_api_key"}}},
}
# Claude Code's connectivity check: it goes on to its first screen when these answer.
CLAUDE_HELLO = ("api/hello", "v1/oauth/hello")
# Codex's own switch for running without its background server (which works
# inside since issue 26: test_codex_cli_starts_its_background_server_...);
# the round-trip tests keep it off, as the version they were written for did.
CODEX_ARGS = ["--disable", "daemon_auto_start"]
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
DOOR_HTTP = "http://127.0.0.1:3128"
# A page of the world for Chromium: plain http under a name on no HSTS preload
# list (Chromium would upgrade http://api.github.com to https).
PAGE_HOST = "pypi.world"
PAGE = f"http://{PAGE_HOST}/whoami"
# What Chromium 156 still reaches for with CHROMIUM_FLAGS (component updates).
CHROMIUM_PHONES_HOME = ("clients2.google.com", "update.googleapis.com")
SCREEN_WAIT = 180          # generous bound for a heavy agent on a loaded machine; never asserted
_counter = itertools.count()
_DEAD = re.compile(r"Pane is dead \((?:status (\d+)|signal (\d+))")


# ── the record, read as it is written
def _run_file(state_home: Path) -> Path | None:
    runs = sorted((state_home / "vpnw" / "runs").glob("*.jsonl"), key=lambda p: p.stat().st_mtime_ns)
    return runs[-1] if runs else None


def record_so_far(state_home: Path) -> list[dict]:
    path = _run_file(state_home)
    if path is None:
        return []
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            break           # the line being written
    return events


# ── a real terminal ──────────────────────────────────────────────────────
class Terminal:
    """One program in a terminal: a private tmux server (its own -S socket)
    whose one pane runs it in the world as `user`, under `vpnw VPNW_ARGS`
    (or, with none, outside vpnw: the control). The pane stays after the
    program ends, so its exit status can be read. vpnw's own lines go to
    --log: written over a full-screen interface they would be in the way of
    what the test reads."""

    def __init__(self, world, program, *, user: str, env: dict, vpnw_args=(), cwd=None):
        n = next(_counter)
        self.sock = world.tmp / f"tmux-agents-{os.getpid()}-{n}.sock"
        conf = world.file("tmux-agents.conf", "set -g remain-on-exit on\nset -g history-limit 100\n")
        self.state_home = world.state_home(user)
        self.vpnw_log = self.state_home / "vpnw.log"
        self.under_vpnw = bool(vpnw_args)
        argv = [VPNW, *vpnw_args, "--log", self.vpnw_log, "--", *program] if vpnw_args else program
        cmd, _ = world.command([str(a) for a in argv], user=user, env=env, cwd=cwd,
                               state_home=self.state_home)
        self.tmux = ["tmux", "-S", str(self.sock), "-f", str(conf)]
        subprocess.run([*self.tmux, "new-session", "-d", "-x", "120", "-y", "40", shlex.join(cmd)],
                       check=True, stdin=subprocess.DEVNULL)

    def screen(self) -> str:
        return subprocess.run([*self.tmux, "capture-pane", "-p", "-J"], capture_output=True,
                              text=True).stdout

    def wait_for(self, text: str) -> str:
        deadline = time.monotonic() + SCREEN_WAIT
        while time.monotonic() < deadline:
            screen = self.screen()
            if text in screen:
                return screen
            if self.status() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"the terminal never showed {text!r}:\n{self.screen()}\n{self.log()}")

    def log(self) -> str:
        try:
            return "--- vpnw's lines\n" + self.vpnw_log.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def keys(self, *keys: str) -> None:
        subprocess.run([*self.tmux, "send-keys", "--", *keys], check=True)

    def press_until(self, key: str, before: str, after: str) -> str:
        """Press `key` while the screen still shows `before`, until it shows
        `after`: a TUI may draw before it reads keys, and drops what comes
        earlier. Never presses twice once the screen has moved on."""
        deadline = time.monotonic() + SCREEN_WAIT
        while time.monotonic() < deadline:
            screen = self.screen()
            if after in screen:
                return screen
            if before in screen:
                self.keys(key)
            time.sleep(0.5)
        raise AssertionError(f"{key} never took the terminal from {before!r} to {after!r}:\n"
                             f"{self.screen()}\n{self.log()}")

    def status(self):
        """The program's exit status once it has ended, else None: tmux (with
        remain-on-exit) writes "Pane is dead (status N, ...)" or "(signal N,
        ...)" once it has the status. (Its pane_dead flag comes earlier, when
        the terminal closes, before the status is known.)"""
        # Under vpnw, its exit code is in the record's run.end (the pane may
        # stay while something else still holds the terminal).
        if self.under_vpnw:
            ends = [e for e in record_so_far(self.state_home) if e["type"] == "run.end"]
            if ends:
                return ends[-1]["fields"]["exit_code"]
        # The whole pane with its scrollback: the line may have scrolled up.
        history = subprocess.run([*self.tmux, "capture-pane", "-p", "-J", "-S", "-"],
                                 capture_output=True, text=True).stdout
        found = _DEAD.search(history)
        if found is None:
            return None
        return int(found.group(1)) if found.group(1) is not None else 128 + int(found.group(2))

    def wait_exit(self) -> int:
        status = self.poll_exit(SCREEN_WAIT)
        if status is None:
            raise AssertionError(f"the program did not end:\n{self.screen()}\n{self.log()}")
        return status

    def poll_exit(self, seconds: float) -> int | None:
        """The exit code (status()) once the program ends within `seconds`, else None."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            status = self.status()
            if status is not None:
                return status
            time.sleep(0.1)
        return None

    def hang_up(self) -> int:
        """Close the terminal, as a person closes the window (tmux sends
        SIGHUP); vpnw's exit code is then read from the record's run.end."""
        subprocess.run([*self.tmux, "kill-server"], capture_output=True)
        deadline = time.monotonic() + SCREEN_WAIT
        while time.monotonic() < deadline:
            ends = [e for e in record_so_far(self.state_home) if e["type"] == "run.end"]
            if ends:
                return ends[-1]["fields"]["exit_code"]
            time.sleep(0.2)
        raise AssertionError(f"the run did not end after the terminal closed\n{self.log()}")

    def wait_record(self, done) -> list[dict]:
        """Wait until the run's record (read as it is written) satisfies `done`."""
        deadline = time.monotonic() + SCREEN_WAIT
        while time.monotonic() < deadline:
            events = record_so_far(self.state_home)
            if done(events):
                return events
            if self.status() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"the record never showed what was expected:\n{self.screen()}\n{self.log()}")

    def pane(self) -> tuple[bool, str]:
        """(whether tmux has closed the pane's terminal, the pane's tty)."""
        out = subprocess.run([*self.tmux, "display-message", "-p", "#{pane_dead} #{pane_tty}"],
                             capture_output=True, text=True).stdout.split()
        return out[:1] == ["1"], out[1] if len(out) > 1 else ""

    def wait_pane_closed(self, tty_stat: os.stat_result) -> None:
        """Wait until tmux closes the pane (its program ended and nothing
        holds its terminal any more); on the bound, name who still holds it."""
        deadline = time.monotonic() + SCREEN_WAIT
        while not self.pane()[0]:
            if time.monotonic() > deadline:
                raise AssertionError(f"the pane stayed open; its terminal is held by {holders(tty_stat)}")
            time.sleep(0.1)

    def close(self) -> None:
        subprocess.run([*self.tmux, "kill-server"], capture_output=True)
        self.sock.unlink(missing_ok=True)


def holders(tty_stat: os.stat_result) -> list[str]:
    """The processes with an fd open on this terminal (the device, on this
    devpts instance: the sandbox's own pts have the same names)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                st = os.stat(f"/proc/{pid}/fd/{fd}")
                if (st.st_rdev, st.st_dev) == (tty_stat.st_rdev, tty_stat.st_dev):
                    found.append(f"{pid} {Path(f'/proc/{pid}/cmdline').read_text()[:80]!r} fd {fd}")
                    break
        except OSError:
            continue
    return found


def prepare_world(world) -> list[Path]:
    """Make the world answer for the agents' hosts; returns what to remove."""
    world.dns_reset({**DEFAULT_NAMES, **AGENT_NAMES})
    made = []
    for rel in CLAUDE_HELLO:
        path = world.docroot / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}\n")
        path.chmod(0o644)
        made.append(path)
    for rel, answer in STAND_IN_ANSWERS.items():
        path = world.docroot / (rel.lstrip("/") + ".answer.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(answer))
        path.chmod(0o644)
        made.append(path)
    for d in {p.parent for p in made} | {world.docroot / "v1"}:
        d.chmod(0o755)
    # The agents' temporary files (Claude Code's /tmp/claude-<uid>, Codex's
    # /tmp/codex-daemon-<uid>) go to the world's own temp directory, removed
    # with it, never to the machine's /tmp.
    agent_tmp = world.tmp / "agent-tmp"
    agent_tmp.mkdir(exist_ok=True)
    agent_tmp.chmod(0o1777)
    world.agent_env = {"SSL_CERT_FILE": str(world.ca_pem), "NODE_EXTRA_CA_CERTS": str(world.ca_pem),
                       "REQUESTS_CA_BUNDLE": str(world.ca_pem), "TERM": "xterm-256color",
                       "TMPDIR": str(agent_tmp)}
    # Codex's background server keeps its socket in /tmp/codex-daemon-<uid>
    # whatever TMPDIR says: the ones this module makes are removed after it.
    made += [d for d in _codex_daemon_dirs() if not d.exists()]
    return made


def _codex_daemon_dirs() -> list[Path]:
    uids = {0, *(pwd.getpwnam(name).pw_uid for name in ("vpnwtest",) if _has_user(name))}
    return [Path(f"/tmp/codex-daemon-{uid}") for uid in sorted(uids)]


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def _served(directory: Path) -> bool:
    """Whether a Codex server still answers on a socket in `directory` (the
    other pytest worker's, running this module's other tests)."""
    for entry in directory.glob("*"):
        if entry.is_socket():
            with socket.socket(socket.AF_UNIX) as probe:
                try:
                    probe.connect(str(entry))
                    return True
                except OSError:
                    pass
    return False


def restore_world(world, made: list[Path]) -> None:
    for path in made:
        if path.is_dir():
            if not _served(path):
                shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    world.dns_reset()
    shutil.rmtree(world.tmp / "agent-tmp", ignore_errors=True)



def stop_codex_daemons(world, user: str) -> None:
    """Outside vpnw, Codex leaves its background server running when it
    ends (and may start it only then): stop it with its own command, then
    end by pid, for a while, whatever this world's Codex left (a process
    whose program lives under the world's homes)."""
    world.run([str(CODEX), "app-server", "daemon", "stop"], user=user, env=world.agent_env, timeout=60)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                exe = os.readlink(f"/proc/{pid}/exe")
            except OSError:
                continue
            if exe.startswith(str(world.tmp) + "/") and "/.codex/" in exe:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
        time.sleep(0.5)


# ── what an agent writes in its home ─────────────────────────────────────
def home_snapshot(home: Path) -> dict[str, tuple[int, int]]:
    """Every file and directory under `home` (symlinks not followed): its
    modification time and size, to compare after a run."""
    seen = {}
    for root, dirs, files in os.walk(home):
        for name in dirs + files:
            path = os.path.join(root, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            seen[path] = (st.st_mtime_ns, st.st_size)
    return seen


def home_writes(home: Path, before: dict[str, tuple[int, int]]) -> set[Path]:
    """The files made or changed under `home` since `before`, and the
    directories made (a directory that only gained entries is not a write
    of its own: its new entries are)."""
    after = home_snapshot(home)
    return {Path(p) for p, stamp in after.items()
            if p not in before or (before[p] != stamp and not os.path.isdir(p))}


def preset_writable(name: str, *, home: Path, cwd: Path) -> list[Path]:
    """The preset's [files] allow_write, with `~` and `.` as vpnw reads them
    for a run with this home and working directory."""
    import tomllib
    from stages.config import presets
    entries = tomllib.loads(presets.text(name)).get("files", {}).get("allow_write", [])
    out = []
    for entry in entries:
        if entry == "~" or entry.startswith("~/"):
            out.append(home / entry[2:])
        elif entry == "." or entry.startswith("./"):
            out.append(cwd / entry[2:])
        else:
            out.append(Path(entry))
    return out


def writes_outside(writes: set[Path], writable: list[Path]) -> list[str]:
    """The writes no allow_write entry covers."""
    return sorted(str(w) for w in writes
                  if not any(w == a or a in w.parents for a in writable))
