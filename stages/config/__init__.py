"""Shared: what the user writes and vpnw reads. The policy, the paths config and
its wg-quick files, file limits, addresses, the program's environment, and
the one reader of input files."""
