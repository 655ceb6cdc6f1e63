"""vpnw: run one program with a network of its own (docs/architecture.md)."""

# The one place the version is written. pyproject.toml reads it at build time
# (the package metadata says the same), and vpnw reads this constant, not the
# metadata: importing importlib.metadata costs ~30 ms of every `vpnw run`.
__version__ = "0.1.0"
