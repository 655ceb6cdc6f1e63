"""Run by tests/test_helper_start_cpu.py."""
# ruff: noqa: E402 (when each module loads is what the test looks at)
import sys
import stages.helper.main  # noqa: F401 (the helper's way to socket)
import socket
print("selectors" in sys.modules)
poll = socket.selectors.PollSelector     # what socket.sendfile asks of it
import selectors
print(poll is selectors.PollSelector, selectors.DefaultSelector.__name__,
      socket.selectors.DefaultSelector is selectors.DefaultSelector)
