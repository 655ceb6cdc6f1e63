"""What a question of `guard --ask` warns the person about (docs/architecture.md, "Ask").

- An address of a private network, of the machine itself, link-local or a
  cloud metadata service, asked for by its literal; a name that by
  definition stays on this machine or a private network (`localhost`,
  `.internal`, the metadata services' names). Nothing is looked up before
  the person answers, so a name is judged by itself only.
- A name never seen in this user's recent runs: a name the agent has used
  before is the usual case, a new one is worth a look. "Recent" is kept
  cheap: the newest run files of vpnw's state directory, at most
  `MAX_FILES` of them and `MAX_BYTES` in all, searched for the name as a
  `conn.request` writes it; the answer is kept for the run.

The wildcard an answer may choose is said in the keys' hint and in the line
that confirms the answer (ask.keys_hint, asker._said).
"""
from __future__ import annotations

import os

MAX_FILES = 200
MAX_BYTES = 32 << 20


def of(host: str, seen: "SeenNames | None") -> tuple[str, ...]:
    """The warnings for a question about `host` (parse_host's canonical form)."""
    # At the first question, not at the start of every guard --ask run:
    # config.addresses brings ipaddress and the special-purpose table.
    from stages.config.addresses import BadHost, classify, classify_name, parse_host
    try:
        parsed = parse_host(host)
    except BadHost:
        return ()
    if not isinstance(parsed, str):
        why = classify(parsed)
        return (f"not a public address: {_short(why)}",) if why else ()
    risks = []
    why = classify_name(parsed)
    if why:
        risks.append(f"not a public name: {_short(why)}")
    if seen is not None and seen.seen(parsed) is False:
        risks.append(f"new: not seen in your last {seen.runs} runs")
    return tuple(risks)


def _short(why: str, limit: int = 90) -> str:
    return why if len(why) <= limit else why[:limit - 1].rstrip() + "…"


class SeenNames:
    """Whether a name appears in this user's newest run files (not this run's)."""

    def __init__(self, runs_dir: str, run_id: str):
        self.runs_dir = runs_dir
        self.run_id = run_id
        self.files: list[str] | None = None
        self.known: dict[str, bool | None] = {}

    @property
    def runs(self) -> int:
        return len(self._files())

    def _files(self) -> list[str]:
        if self.files is None:
            try:
                names = [n for n in os.listdir(self.runs_dir)
                         if n.endswith(".jsonl") and not n.startswith(self.run_id)]
            except OSError:
                names = []
            dated = []
            for name in names:
                path = os.path.join(self.runs_dir, name)
                try:
                    dated.append((os.stat(path).st_mtime_ns, path))
                except OSError:
                    pass
            self.files = [path for _t, path in sorted(dated, reverse=True)[:MAX_FILES]]
        return self.files

    def seen(self, name: str) -> bool | None:
        """True when a recent run asked for `name`; False when none did;
        None when there is no earlier run to compare with."""
        if name in self.known:
            return self.known[name]
        files = self._files()
        found: bool | None = None if not files else False
        needle = b'"host":"' + name.encode("ascii", "replace") + b'"'
        budget = MAX_BYTES
        for path in files:
            if budget <= 0:
                break
            try:
                with open(path, "rb") as handle:
                    data = handle.read(budget)
            except OSError:
                continue
            budget -= len(data)
            if needle in data:
                found = True
                break
        self.known[name] = found
        return found
