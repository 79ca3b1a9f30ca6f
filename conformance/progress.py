"""Progress of a conformance run on a stream (stderr): a bar on a terminal, else a line per op."""

from __future__ import annotations

import time
from typing import TextIO

from rlkernel.conformance.records import Record


class StreamProgress:
    """A plain progress display, no dependency.

    On a terminal: one self-overwriting line ``[#####.....] 12/40 op/case``. Elsewhere (CI
    logs): one line per op when it completes, ``op: N passed, N failed (s)``.
    """

    def __init__(self, stream: TextIO, width: int = 30):
        self.stream = stream
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.width = width
        self.total = 0
        self.done = 0
        self._op: str | None = None
        self._counts = [0, 0]
        self._t0 = time.perf_counter()

    def start(self, total: int) -> None:
        self.total = total
        self._t0 = time.perf_counter()

    def update(self, record: Record) -> None:
        if record.op != self._op:
            self._flush_op()
            self._op = record.op
        self._counts[1 if record.failed else 0] += 1
        self.done += 1
        if self.tty:
            filled = self.width * self.done // max(self.total, self.done, 1)
            bar = "#" * filled + "." * (self.width - filled)
            label = f"{record.op}/{record.case}"[:50]
            self.stream.write(f"\r[{bar}] {self.done}/{max(self.total, self.done)} {label:<50}")
            self.stream.flush()

    def _flush_op(self) -> None:
        if self._op is not None and not self.tty:
            elapsed = time.perf_counter() - self._t0
            self.stream.write(f"{self._op}: {self._counts[0]} passed, {self._counts[1]} failed ({elapsed:.1f} s)\n")
            self.stream.flush()
        self._counts = [0, 0]
        self._t0 = time.perf_counter()

    def finish(self) -> None:
        self._flush_op()
        self._op = None
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
