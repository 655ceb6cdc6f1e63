"""The recorder stage: the run file and the human lines (`main`), the side
outputs (`feeder`, `syslog_out`, `shipping/`), and `vpnw runs` / `vpnw show`
(`commands`)."""
