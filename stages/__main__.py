from stages.orchestrator.cli import main

main()
