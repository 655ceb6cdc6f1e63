"""Run by tests/test_quick_parse.py."""
import sys
from stages.orchestrator import main, run_command
run_command.execute = lambda mode, program, **opts: print("executed", mode, list(program)) or 0
try:
    main.main(sys.argv[1:])
except SystemExit as exc:
    print("exit", exc.code)
print("click" in sys.modules)
