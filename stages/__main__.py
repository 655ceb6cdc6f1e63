from stages.orchestrator.main import main

main()
