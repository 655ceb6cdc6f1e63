"""The orchestrator: vpnw's command line, the run that starts and joins the
stages, the user's terminal and `vpnw doctor`. The only package that may
import every stage (docs/architecture.md, "Layout")."""
