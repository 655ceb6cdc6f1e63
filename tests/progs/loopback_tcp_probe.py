"""Run by tests/test_e2e_relay.py. Inside the sandbox: the namespace's TCP
default, the program's own socket to the SOCKS5 door and, through sock_diag
(`ss`), both ends of that connection (the door's end is the broker's
accepted socket, in this namespace too)."""
import socket
import subprocess
print("default", open("/proc/sys/net/ipv4/tcp_congestion_control").read().strip())
s = socket.create_connection(("127.0.0.1", 1080))
s.sendall(b"\x05\x01\x00")
assert s.recv(2) == b"\x05\x00"
print("program", s.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).rstrip(b"\0").decode())
out = subprocess.run(["ss", "-tinH", "state", "established"], capture_output=True, text=True, check=True).stdout
ends = [line.split()[0] for line in out.splitlines() if line.startswith("\t") or line.startswith(" ")]
print("ends", " ".join(ends))
