"""Shared: what crosses a channel. Status messages to the orchestrator, the
helper -> broker handoff, vpnw's exit codes, and the sans-I/O clients of the
upstream proxies vpnw speaks to."""
