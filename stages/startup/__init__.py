"""Start-up tricks: everything vpnw does to start faster than plain Python
would, in one place (docs/architecture.md, "Start-up budget")."""
