"""The program's own terminal: a pty made inside the sandbox, relayed to the user's.

sudo's `use_pty` model (docs/architecture.md, "The terminal"). When vpnw runs on a
terminal, the helper makes a new pseudo-terminal in the sandbox's own devpts
and hands its master to the orchestrator; the program's new session gets the slave as its controlling terminal (so /dev/tty works inside)
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

This module is the thin shell; what goes where in the output stream is
decided by the pure `line_merger.LineMerger`.
"""
from __future__ import annotations

import errno
import fcntl
import os
import select
import signal
import struct
import termios
import time

from stages.orchestrator.escapes import ClipboardFilter
from stages.orchestrator.line_merger import LineMerger

# How long vpnw's lines wait for the program to finish a half-written line.
HOLD_SECONDS = 0.5
_READ = 65536
# Keys typed ahead while the program does not read: stop reading the user's
# terminal beyond this, so the keyboard, not our memory, waits.
_MAX_TO_PROGRAM = 1 << 16


def _raw(mode: list) -> list:
    """cfmakeraw(3) on a copy of a tcgetattr() list."""
    iflag, oflag, cflag, lflag, ispeed, ospeed, cc = mode
    iflag &= ~(termios.IGNBRK | termios.BRKINT | termios.PARMRK | termios.ISTRIP
               | termios.INLCR | termios.IGNCR | termios.ICRNL | termios.IXON)
    oflag &= ~termios.OPOST
    lflag &= ~(termios.ECHO | termios.ECHONL | termios.ICANON | termios.ISIG | termios.IEXTEN)
    cflag &= ~(termios.CSIZE | termios.PARENB)
    cflag |= termios.CS8
    cc = list(cc)
    cc[termios.VMIN] = 1
    cc[termios.VTIME] = 0
    return [iflag, oflag, cflag, lflag, ispeed, ospeed, cc]


def _winsize(fd: int) -> bytes | None:
    try:
        return fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8)
    except OSError:
        return None


def _columns_rows(winsize: bytes | None) -> tuple[int, int]:
    if not winsize:
        return 80, 24
    rows, cols, _x, _y = struct.unpack("HHHH", winsize)
    return cols or 80, rows or 24


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
        # --no-clipboard: OSC 52 never reaches the user's terminal (docs/security.md).
        self.clipboard_filter = ClipboardFilter() if no_clipboard else None
        self.user_in = user_in
        self.user_out = user_out
        self.master = None
        self.master_from = master_from   # a socket the master will come over
        self.master_refused: str | None = None   # what came instead of a pty master
        self.human_r = human_r
        if human_r is not None:
            os.set_blocking(human_r, False)
        self.saved = termios.tcgetattr(user_in)
        self.raw = False
        self.reading_keys = False
        self.master_open = False
        # Raw only once the program is let go: until then Ctrl-C is vpnw's (it
        # stops the run at once) and what the user types stays for the shell.
        self.program_going = False
        self.sel = None
        self.master_mask = 0
        self.human_open = human_r is not None
        self.human_buf = b""
        self.to_program = b""
        self.output_gone = False     # the user's terminal went away: output is dropped
        self.key_filter = None       # guard --ask: takes its answer keys out (asker.py)
        self.tail = b""              # the program's last output bytes (see write_control)
        columns, rows = _columns_rows(_winsize(user_out))
        self.merger = LineMerger(hold=HOLD_SECONDS, newline=b"\r\n", columns=columns, rows=rows)
        if master is not None:
            self._attach(master)

    # ---- the user's terminal

    def foreground(self) -> bool:
        try:
            return os.tcgetpgrp(self.user_in) == os.getpgrp()
        except OSError:
            return False

    def enter_raw(self) -> None:
        if (self.raw or not self.keys or not self.program_going or not self.master_open
                or not self.foreground()):
            return
        try:
            termios.tcsetattr(self.user_in, termios.TCSADRAIN, _raw(self.saved))
        except termios.error:
            return
        self.raw = True

    def restore(self) -> None:
        """The user's terminal exactly as it was. SIGTTOU is blocked meanwhile, so
        a vpnw moved to the background cannot be stopped half way."""
        if not self.raw:
            return
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTTOU})
        try:
            termios.tcsetattr(self.user_in, termios.TCSADRAIN, self.saved)
        except termios.error:
            pass
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        self.raw = False

    def resize(self) -> None:
        size = _winsize(self.user_out) or _winsize(self.user_in)
        if size is None or not self.master_open:
            return
        self.merger.columns, self.merger.rows = _columns_rows(size)
        try:
            fcntl.ioctl(self.master, termios.TIOCSWINSZ, size)
        except OSError:
            pass

    # ---- the master

    def _attach(self, master: int) -> None:
        self.master = master
        self.master_open = True
        os.set_blocking(master, False)
        # Termios and window-size calls on a master act on its slave: the
        # program's terminal starts in the user's mode and size.
        try:
            termios.tcsetattr(master, termios.TCSANOW, self.saved)
        except termios.error:
            pass
        size = _winsize(self.user_out) or _winsize(self.user_in)
        if size:
            fcntl.ioctl(master, termios.TIOCSWINSZ, size)
        if self.sel is not None:
            self.master_mask = self._master_events()
            self.sel.register(master, self.master_mask, "pty:master")
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
        from stages.wire.pty_handoff import PtyHandoffError, receive_master
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
        self.master_mask = self._master_events()
        if self.master_open:
            sel.register(self.master, self.master_mask, "pty:master")
        if self.master_from is not None:
            sel.register(self.master_from, 1, "pty:socket")
        if self.human_r is not None:
            sel.register(self.human_r, 1, "pty:human")
        self._update_keys()

    def _master_events(self) -> int:
        import selectors
        return selectors.EVENT_READ | (selectors.EVENT_WRITE if self.to_program else 0)

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
        want = self.raw and self.master_open and len(self.to_program) < _MAX_TO_PROGRAM
        if want and not self.reading_keys:
            self.sel.register(self.user_in, 1, "pty:keys")
        elif not want and self.reading_keys:
            self.sel.unregister(self.user_in)
        self.reading_keys = want
        mask = self._master_events()
        if self.master_open and mask != self.master_mask:
            self.sel.modify(self.master, mask, "pty:master")
            self.master_mask = mask

    def timeout(self, now: float, default: float) -> float:
        deadline = self.merger.deadline()
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
                data = os.read(self.user_in, _READ)
            except OSError:
                data = b""
            if not data:
                # The user's terminal is gone (hang-up): stop reading it; the
                # SIGHUP that comes with it ends the program as before.
                self._unregister(self.user_in)
                self.reading_keys = False
                self.raw = False
                return
            if self.key_filter is not None:
                data = self.key_filter(data)
            self.to_program += data
            self._flush_to_program()
        elif what == "pty:master":
            if events & 2:
                self._flush_to_program()
            if events & 1:
                self._read_program(now)
        elif what == "pty:human":
            self._read_human(now)
        self._update_keys()

    def tick(self) -> None:
        self._write(self.merger.tick(time.monotonic()))

    def _flush_to_program(self) -> None:
        if not self.to_program or not self.master_open:
            return
        try:
            n = os.write(self.master, self.to_program)
        except BlockingIOError:
            return
        except OSError:
            self.to_program = b""
            return
        self.to_program = self.to_program[n:]

    def _read_program(self, now: float) -> bool:
        """What the master has now (a pty hands out at most a few kB a read:
        several reads make one write); False once the program's side is closed."""
        chunks = []
        open_ = True
        for _ in range(64):
            try:
                data = os.read(self.master, _READ)
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
        if chunks:
            data = b"".join(chunks)
            if self.clipboard_filter is not None:
                data = self.clipboard_filter.feed(data)
            self.tail = (self.tail + data[-256:])[-256:]
            self._write(self.merger.program_output(data, now))
        if not open_:
            self._close_master()
        return open_

    def _close_master(self) -> None:
        if self.master_open:
            self.master_open = False
            self._unregister(self.master)
            if self.reading_keys:
                self._unregister(self.user_in)
                self.reading_keys = False

    def _read_human(self, now: float) -> bool:
        try:
            data = os.read(self.human_r, _READ)
        except BlockingIOError:
            return True
        if not data:
            self.human_open = False
            self._unregister(self.human_r)
            if self.human_buf:
                self._write(self.merger.human_line(self.human_buf, now))
                self.human_buf = b""
            return False
        self.human_buf += data
        *lines, self.human_buf = self.human_buf.split(b"\n")
        for line in lines:
            self._write(self.merger.human_line(line, now))
        return True

    def say(self, text: str) -> None:
        """One of vpnw's own lines (the orchestrator's messages)."""
        self._write(self.merger.human_line(text.encode("utf-8", "replace"), time.monotonic()))

    def write_control(self, data: bytes, force: bool = False) -> bool:
        """Control sequences of vpnw's own (a title, a bell) that draw
        nothing on the screen: written now unless the program's output
        stops inside an escape sequence, where they would land in it (then
        False: try again later)."""
        from stages.orchestrator.ask import mid_escape
        if not force and mid_escape(self.tail):
            return False
        self._write(data)
        return True

    def _write(self, data: bytes) -> None:
        if not data or self.output_gone:
            return
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.user_out, view):]
            except InterruptedError:
                continue
            except BlockingIOError:
                select.select([], [self.user_out], [])
            except OSError:
                self.output_gone = True
                return

    # ---- job control

    def program_stopped(self, signo: int) -> None:
        """The program stopped: stop vpnw with it, and on `fg` continue both."""
        if signo in (signal.SIGTTIN, signal.SIGTTOU) and self.foreground():
            # It wanted the terminal and vpnw holds it in the foreground: go on.
            self.enter_raw()
            self._continue_program()
            return
        self._drain_program(wait=0.0)
        self._write(self.merger.finish() if self.merger.held else b"")
        self.restore()
        stop = signal.SIGSTOP if signo == signal.SIGSTOP else signal.SIGTSTP
        old = signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        try:
            os.killpg(os.getpgrp(), stop)  # the whole job, as the shell expects
        finally:
            signal.signal(signal.SIGTSTP, old)
        self.resumed()
        self._continue_program()

    def resumed(self) -> None:
        """vpnw was continued (SIGCONT): raw again if it is in the foreground,
        from the mode the user's terminal has now (the shell may have set it
        while vpnw was stopped)."""
        if not self.raw and self.foreground():
            try:
                self.saved = termios.tcgetattr(self.user_in)
            except termios.error:
                pass
        self.enter_raw()
        self.resize()
        if self.sel is not None:
            self._update_keys()

    def _continue_program(self) -> None:
        if not self.master_open:
            return
        try:
            pgrp = os.tcgetpgrp(self.master)
        except OSError:
            return
        try:
            os.killpg(pgrp, signal.SIGCONT)
        except OSError:
            pass

    # ---- the end

    def _drain_program(self, wait: float) -> None:
        """Copy out what the program wrote; with `wait`, until its side closes
        (all slave fds gone) or nothing came for `wait` seconds."""
        while self.master_open:
            ready, _, _ = select.select([self.master], [], [], wait)
            if not ready:
                return
            if not self._read_program(time.monotonic()):
                return

    def finish_program(self) -> None:
        """The program has ended: the rest of its output."""
        self._drain_program(wait=2.0)
        self._close_master()
        self._write(self.merger.program_ended())

    def finish_human(self, recorder_pidfd: int) -> None:
        """vpnw's remaining lines, until the recorder has exited and its pipe is empty."""
        while self.human_open:
            ready, _, _ = select.select([self.human_r, recorder_pidfd], [], [])
            if self.human_r in ready:
                if not self._read_human(time.monotonic()):
                    break
            elif recorder_pidfd in ready:
                # The recorder is gone: take what is left, without waiting on
                # anything it may have left behind holding the pipe.
                while self._read_human(time.monotonic()):
                    if not select.select([self.human_r], [], [], 0)[0]:
                        break
                break

    def close(self) -> None:
        """Every ending: the last lines, the user's terminal as it was, fds closed."""
        try:
            if self.clipboard_filter is not None:
                self._write(self.merger.program_output(self.clipboard_filter.finish(),
                                                       time.monotonic()))
            if self.human_buf:
                self._write(self.merger.human_line(self.human_buf, time.monotonic()))
                self.human_buf = b""
            self._write(self.merger.finish())
        finally:
            self.restore()
            if self.master_from is not None:
                self.master_from.close()
                self.master_from = None
            for fd in (self.master, self.human_r):
                if fd is not None:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
