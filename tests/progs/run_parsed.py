"""Run by tests/test_startup_imports.py: `vpnw run --quiet -- true` parsed
(the run itself stood in for), then the commands click built."""
from stages.orchestrator import cli

cli._execute = lambda mode, program, **opts: print("executed", mode, list(program), opts["quiet"]) or 0
cli.cli.main(["run", "--quiet", "--", "true"], standalone_mode=False)
print(sorted(cli.cli.commands))
