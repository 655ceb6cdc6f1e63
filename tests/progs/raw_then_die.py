"""Run by tests/test_e2e_terminal.py."""
import os
import signal
import sys
import termios
import tty
tty.setraw(0)                               # echo off, no line editing...
attrs = termios.tcgetattr(0)
attrs[3] &= ~termios.ECHO
termios.tcsetattr(0, termios.TCSANOW, attrs)
if sys.argv[1] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)    # ...and never restores it
