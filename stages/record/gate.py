"""The record gate: whether the broker may dial (docs/security.md, "A full
disk hides nothing").

One byte of memory shared by the recorder and every broker process (an
anonymous MAP_SHARED page the orchestrator maps before it forks them). The
recorder opens the gate once it holds room reserved in the run file
(recorder/reserve.py) and closes it for good when it cannot reserve more.
The broker writes a connection's decision into the event pipe, then reads
the gate, and dials only while it is open: so every dial's decision is
either in the record already or in the pipe when the gate closes, and the
room still reserved then holds the pipe's whole content.
"""
from __future__ import annotations

import mmap

_SHUT, _OPEN, _CLOSED = 0, 1, 2


class RecordGate:
    def __init__(self):
        self._page = mmap.mmap(-1, mmap.PAGESIZE)   # MAP_SHARED | MAP_ANONYMOUS: kept across fork
        self._page[0] = _SHUT                       # until the recorder has room

    @property
    def is_open(self) -> bool:
        return self._page[0] == _OPEN

    def open(self) -> None:
        if self._page[0] == _SHUT:
            self._page[0] = _OPEN

    def close(self) -> None:
        self._page[0] = _CLOSED
