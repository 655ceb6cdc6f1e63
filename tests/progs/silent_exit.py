"""Run by tests/test_e2e_signals.py. A "proxy" that accepts and never answers:
vpnw's path check waits on it."""
import socket
server = socket.create_server(("127.0.0.1", 0))
print(server.getsockname()[1], flush=True)
held = []
while True:
    conn, _ = server.accept()
    held.append(conn)
    print("accepted", flush=True)
