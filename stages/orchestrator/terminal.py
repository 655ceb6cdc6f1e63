"""The program's own terminal: a pty made inside the sandbox, relayed to the user's.

sudo's `use_pty` model (docs/architecture.md, "The terminal"). When vpnw runs on a
terminal, the helper, already inside the sandbox, makes a new pseudo-terminal in the
sandbox's own devpts and hands its master to the orchestrator; the
program's new session gets the slave as its controlling terminal (so
/dev/tty works inside)
and never holds an fd of the user's terminal, so nothing it does to its
terminal (tcsetattr, TIOCSWINSZ, TIOCSTI) reaches the user's. The
orchestrator puts the user's terminal in raw mode, relays keys to the master
and the program's output back, passes window-size changes on, and puts the
user's terminal back exactly as it found it whatever way the run ends.

Job control: Ctrl-Z reaches the pty as a byte, the pty's line discipline
stops the program, the sandbox's init sees it (waitpid WUNTRACED) and the
helper reports it; `suspend` then restores the user's terminal and stops
vpnw's own process group, so the shell sees the job stopped. `fg` continues
vpnw, which re-enters raw mode and continues the program's foreground group.

This module is the pump: the pty master, vpnw's lines' pipe and the
user's keys on the orchestrator's selector, and job control. What is drawn
on the user's terminal, and its mode, are user_terminal.py's; what goes
where in the output stream is decided by the pure `line_merger.LineMerger`.
"""
from __future__ import annotations

import errno
import fcntl
import os
import select
import signal
import termios
import time

from stages.orchestrator.user_terminal import TerminalScreen, UserTerminal
from stages.wire.pty_handoff import PtyHandoffError, receive_master

# The selector's events, as selectors names them (this module never imports
# selectors: run.py's wait does, once every stage is forked).
EVENT_READ, EVENT_WRITE = 1, 2

_READ = 65536
# Keys typed ahead while the program does not read: stop reading the user's
# terminal beyond this, so the keyboard, not our memory, waits.
_MAX_TO_PROGRAM = 1 << 16


class PtyMaster:
    """The program's side of the relay: the pty master once the helper has
    handed it over, the keys waiting for the program, its output as it comes."""

    def __init__(self):
        self.fd: int | None = None
        self.open = False
        self.to_program = b""

    def attach(self, fd: int, mode: list, size: bytes | None) -> None:
        self.fd, self.open = fd, True
        os.set_blocking(fd, False)
        # Termios and window-size calls on a master act on its slave: the
        # program's terminal starts in the user's mode and size.
        try:
            termios.tcsetattr(fd, termios.TCSANOW, mode)
        except termios.error:
            pass
        if size:
            self.resize(size)

    def resize(self, size: bytes) -> None:
        try:
            fcntl.ioctl(self.fd, termios.TIOCSWINSZ, size)
        except OSError:
            pass

    def flush(self) -> None:
        """As many waiting keys as the program's side takes now."""
        if not self.to_program or not self.open:
            return
        try:
            n = os.write(self.fd, self.to_program)
        except BlockingIOError:
            return
        except OSError:
            self.to_program = b""
            return
        self.to_program = self.to_program[n:]

    def read(self) -> tuple[bytes, bool]:
        """(what the master has now, still open). A pty hands out at most a
        few kB a read: several reads make one write to the user's terminal."""
        chunks = []
        open_ = True
        for _ in range(64):
            try:
                data = os.read(self.fd, _READ)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno != errno.EIO:
                    raise
                data = b""  # EIO: every slave fd is closed
            if not data:
                open_ = False
                break
            chunks.append(data)
        return b"".join(chunks), open_

    def continue_program(self) -> None:
        """SIGCONT to the pty's foreground group (the program's job)."""
        if not self.open:
            return
        try:
            os.killpg(os.tcgetpgrp(self.fd), signal.SIGCONT)
        except OSError:
            pass


class HumanPipe:
    """vpnw's own lines (the recorder's and the broker's stderr) from their
    pipe, cut at newlines."""

    def __init__(self, fd: int | None):
        self.fd = fd
        self.open = fd is not None
        self.buf = b""
        if fd is not None:
            os.set_blocking(fd, False)

    def read(self) -> tuple[list[bytes], bool]:
        """(the whole lines that came, still open); at the end, the last half line too."""
        try:
            data = os.read(self.fd, _READ)
        except BlockingIOError:
            return [], True
        if not data:
            self.open = False
            rest = self.take_rest()
            return ([rest] if rest else []), False
        *lines, self.buf = (self.buf + data).split(b"\n")
        return lines, True

    def take_rest(self) -> bytes:
        rest, self.buf = self.buf, b""
        return rest


class TerminalRelay:
    """Relays between the user's terminal (user_in/user_out) and the pty master.

    `human_r` is the read end of the pipe that carries vpnw's human lines
    (the recorder's and the broker's stderr); they are merged into the
    program's output at line boundaries.

    `keys`: the user's stdin is the terminal, and keys are relayed (raw mode,
    in the foreground only). Without it (`vpnw run -- agent < /dev/null`)
    `user_in` is only where the terminal's mode and size are read: the relay
    never reads it nor changes its mode, so what the user types goes to the
    shell.
    """

    def __init__(self, user_in: int, user_out: int, master: int | None, human_r: int | None,
                 master_from=None, keys: bool = True, no_clipboard: bool = False):
        self.keys = keys
        self.user = UserTerminal(user_in, user_out)
        self.screen = TerminalScreen(self.user, no_clipboard)
        self.pty = PtyMaster()
        self.master_from = master_from   # a socket the master will come over
        self.master_refused: str | None = None   # what came instead of a pty master
        self.human = HumanPipe(human_r)
        self.reading_keys = False
        # Raw only once the program is let go: until then Ctrl-C is vpnw's (it
        # stops the run at once) and what the user types stays for the shell.
        self.program_going = False
        self.sel = None
        self.master_mask = 0
        # guard --ask (asker.py): while vpnw's question is on the normal screen
        # the program's output is not read (it waits in its pty), so nothing
        # it draws can change the question the person is reading.
        self.output_held = False
        self.key_filter = None       # guard --ask: takes its answer keys out (asker.py)
        if master is not None:
            self._attach(master)

    # ---- the user's terminal

    def enter_raw(self) -> None:
        """Raw mode only once the program is let go and its terminal is here."""
        if self.keys and self.program_going and self.pty.open:
            self.user.enter_raw()

    def resize(self) -> None:
        size = self.user.size()
        if size is None or not self.pty.open:
            return
        self.screen.resize(size)
        self.pty.resize(size)

    # ---- the master

    def _attach(self, master: int) -> None:
        self.pty.attach(master, self.user.saved, self.user.size())
        if self.sel is not None:
            self.master_mask = 0
            self._apply_master_mask()
            self.enter_raw()
            self._update_keys()

    def program_started(self) -> None:
        """The program was let go: the user's keys are its from now on."""
        self.program_going = True
        self.enter_raw()
        self._update_keys()

    def awaiting_master(self) -> bool:
        return self.master_from is not None

    def _receive_master(self) -> None:
        sock, self.master_from = self.master_from, None
        self._unregister(sock.fileno())
        try:
            self._attach(receive_master(sock))
        except PtyHandoffError as exc:
            self.master_refused = str(exc)
        finally:
            sock.close()

    # ---- the selector

    def start(self, sel) -> None:
        self.sel = sel
        self.enter_raw()
        self.master_mask = 0
        self._apply_master_mask()
        if self.master_from is not None:
            sel.register(self.master_from, EVENT_READ, "pty:socket")
        if self.human.fd is not None:
            sel.register(self.human.fd, EVENT_READ, "pty:human")
        self._update_keys()

    def _master_events(self) -> int:
        return ((0 if self.output_held else EVENT_READ)
                | (EVENT_WRITE if self.pty.to_program else 0))

    def _apply_master_mask(self) -> None:
        mask = self._master_events()
        if self.sel is None or not self.pty.open or mask == self.master_mask:
            return
        if self.master_mask == 0:
            self.sel.register(self.pty.fd, mask, "pty:master")
        elif mask == 0:
            self.sel.unregister(self.pty.fd)
        else:
            self.sel.modify(self.pty.fd, mask, "pty:master")
        self.master_mask = mask

    def hold_output(self, held: bool) -> None:
        """Stop (or go on) reading the program's output (see output_held)."""
        if held != self.output_held:
            self.output_held = held
            self._apply_master_mask()

    def detach(self) -> None:
        """The orchestrator's selector is closing; the ending drains without it."""
        self.sel = None
        self.reading_keys = False

    def _unregister(self, fd: int) -> None:
        if self.sel is not None:
            try:
                self.sel.unregister(fd)
            except (KeyError, ValueError):
                pass

    def _update_keys(self) -> None:
        """Read keys only in the foreground (a background read would stop vpnw)
        and only while the program keeps up with them."""
        if self.sel is None:
            return
        want = self.user.raw and self.pty.open and len(self.pty.to_program) < _MAX_TO_PROGRAM
        if want and not self.reading_keys:
            self.sel.register(self.user.fd_in, EVENT_READ, "pty:keys")
        elif not want and self.reading_keys:
            self.sel.unregister(self.user.fd_in)
        self.reading_keys = want
        self._apply_master_mask()

    def timeout(self, now: float, default: float) -> float:
        deadline = self.screen.merger.deadline()
        if deadline is None:
            return default
        return max(0.0, min(default, deadline - now))

    def handle(self, what: str, events: int) -> None:
        now = time.monotonic()
        if what == "pty:socket":
            self._receive_master()
            return
        if what == "pty:keys":
            try:
                data = os.read(self.user.fd_in, _READ)
            except OSError:
                data = b""
            if not data:
                # The user's terminal is gone (hang-up): stop reading it; the
                # SIGHUP that comes with it ends the program as before.
                self._unregister(self.user.fd_in)
                self.reading_keys = False
                self.user.raw = False
                return
            if self.key_filter is not None:
                data = self.key_filter(data)
            self.pty.to_program += data
            self.pty.flush()
        elif what == "pty:master":
            if events & EVENT_WRITE:
                self.pty.flush()
            if events & EVENT_READ:
                self._read_program(now)
        elif what == "pty:human":
            self._read_human(now)
        self._update_keys()

    def tick(self) -> None:
        self.screen.tick()

    def _read_program(self, now: float) -> bool:
        """What the master has now; False once the program's side is closed."""
        data, open_ = self.pty.read()
        if data:
            self.screen.program_output(data, now)
        if not open_:
            self._close_master()
        return open_

    def _close_master(self) -> None:
        if self.pty.open:
            self.pty.open = False
            self._unregister(self.pty.fd)
            if self.reading_keys:
                self._unregister(self.user.fd_in)
                self.reading_keys = False

    def _read_human(self, now: float) -> bool:
        lines, open_ = self.human.read()
        for line in lines:
            self.screen.human_line(line, now)
        if not open_:
            self._unregister(self.human.fd)
        return open_

    def say(self, text: str) -> None:
        """One of vpnw's own lines (the orchestrator's messages)."""
        self.screen.say(text)

    # ---- job control

    def program_stopped(self, signo: int) -> None:
        """The program stopped: stop vpnw with it, and on `fg` continue both."""
        if signo in (signal.SIGTTIN, signal.SIGTTOU) and self.user.foreground():
            # It wanted the terminal and vpnw holds it in the foreground: go on.
            self.enter_raw()
            self.pty.continue_program()
            return
        self._drain_program(wait=0.0)
        self.screen.flush_held()
        self.user.restore()
        stop = signal.SIGSTOP if signo == signal.SIGSTOP else signal.SIGTSTP
        old = signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        try:
            os.killpg(os.getpgrp(), stop)  # the whole job, as the shell expects
        finally:
            signal.signal(signal.SIGTSTP, old)
        self.resumed()
        self.pty.continue_program()

    def resumed(self) -> None:
        """vpnw was continued (SIGCONT): raw again if it is in the foreground,
        from the mode the user's terminal has now (the shell may have set it
        while vpnw was stopped)."""
        if not self.user.raw and self.user.foreground():
            try:
                self.user.saved = termios.tcgetattr(self.user.fd_in)
            except termios.error:
                pass
        self.enter_raw()
        self.resize()
        if self.sel is not None:
            self._update_keys()

    # ---- the end

    def _drain_program(self, wait: float) -> None:
        """Copy out what the program wrote; with `wait`, until its side closes
        (all slave fds gone) or nothing came for `wait` seconds."""
        while self.pty.open:
            ready, _, _ = select.select([self.pty.fd], [], [], wait)
            if not ready:
                return
            if not self._read_program(time.monotonic()):
                return

    def finish_program(self) -> None:
        """The program has ended: the rest of its output, then the terminal's
        modes put back before vpnw's last lines."""
        self._drain_program(wait=2.0)
        self._close_master()
        self.screen.program_ended(had_terminal=self.pty.fd is not None)

    def finish_human(self, recorder_pidfd: int) -> None:
        """vpnw's remaining lines, until the recorder has exited and its pipe is empty."""
        while self.human.open:
            ready, _, _ = select.select([self.human.fd, recorder_pidfd], [], [])
            if self.human.fd in ready:
                if not self._read_human(time.monotonic()):
                    break
            elif recorder_pidfd in ready:
                # The recorder is gone: take what is left, without waiting on
                # anything it may have left behind holding the pipe.
                while self._read_human(time.monotonic()):
                    if not select.select([self.human.fd], [], [], 0)[0]:
                        break
                break

    def close(self) -> None:
        """Every ending: the last lines, the user's terminal as it was, fds closed."""
        try:
            self.screen.finish(self.human.take_rest(), had_terminal=self.pty.fd is not None)
        finally:
            self.user.restore()
            if self.master_from is not None:
                self.master_from.close()
                self.master_from = None
            for fd in (self.pty.fd, self.human.fd):
                if fd is not None:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
