"""The recorder stage: the run file and the human lines (`main`), the side
outputs (`feeder`, `syslog_out`, `shipping/`), and `vpnw runs` / `vpnw show`
(`commands`)."""
import os


def say(text: str) -> None:
    """One line of the recorder's to the person (its stderr, vpnw's human
    lines' pipe): what became of a side output, or of the record itself."""
    try:
        os.write(2, f"vpnw: {text}\n".encode("utf-8", "replace"))
    except OSError:
        pass
