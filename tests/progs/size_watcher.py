"""Run by tests/test_e2e_terminal.py."""
import os
import signal
import sys
def show(*_):
    cols, rows = os.get_terminal_size(0)
    print(f"size {cols}x{rows}", flush=True)
signal.signal(signal.SIGWINCH, show)
show()
sys.stdin.readline()
