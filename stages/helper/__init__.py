"""The helper stage: the sandbox the program runs in (docs/architecture.md,
"The sandbox"). Entry: `main.run_helper`."""
