"""Progress of a long run on a stream (stderr): a bar on a terminal, else plain lines.

Used by ``rlkernel conformance`` (records) and ``rlkernel bench`` (rows): anything with ``op``,
``case`` and ``failed`` can be counted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol, TextIO


class Item(Protocol):
    """What the display counts: a conformance record or a bench row."""

    @property
    def op(self) -> str: ...

    @property
    def case(self) -> str: ...

    @property
    def failed(self) -> bool: ...


def clock(seconds: float) -> str:
    """``m:ss`` (``h:mm:ss`` from an hour) for an elapsed time."""
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class StreamProgress:
    """A plain progress display, no dependency.

    On a terminal: one self-overwriting line ``[#####.....] 12/40 0:31 op/case`` (items done of
    the total, elapsed time). Elsewhere (CI logs): one line per op when it completes,
    ``op: N passed, N failed (s)``.

    Parameters
    ----------
    stream : text stream
        Where to write (``sys.stderr``).
    width : int
        Characters of the bar.
    describe : callable, optional
        ``item -> str``, a one-line result. When given, every item gets its own line
        ``[12/40 0:31] op/case: <result>`` (above the bar on a terminal) instead of one line per
        op: for runs of few, slow items such as ``rlkernel bench``.
    """

    def __init__(self, stream: TextIO, width: int = 30, describe: Callable[[Any], str] | None = None):
        self.stream = stream
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.width = width
        self.describe = describe
        self.total = 0
        self.done = 0
        self._op: str | None = None
        self._counts = [0, 0]
        self._t0 = self._start = time.perf_counter()
        self._bar = 0  # length of the bar line on the terminal, to blank it

    @property
    def elapsed(self) -> float:
        """Seconds since :meth:`start`."""
        return time.perf_counter() - self._start

    def start(self, total: int) -> None:
        self.total = total
        self._t0 = self._start = time.perf_counter()
        if self.tty:
            self._draw("")

    def update(self, record: Item) -> None:
        if record.op != self._op:
            self._flush_op()
            self._op = record.op
        self._counts[1 if record.failed else 0] += 1
        self.done += 1
        label = f"{record.op}/{record.case}"
        if self.describe is not None:
            result = self.describe(record)
            line = f"[{self.done}/{max(self.total, self.done)} {clock(self.elapsed)}] {label}"
            line += f": {result}" if result else ""
            self.stream.write(("\r" + line.ljust(self._bar) if self.tty else line) + "\n")
        if self.tty:
            self._draw(label)
        self.stream.flush()

    def _draw(self, label: str) -> None:
        total = max(self.total, self.done, 1)
        filled = self.width * self.done // total
        bar = "#" * filled + "." * (self.width - filled)
        text = f"[{bar}] {self.done}/{max(self.total, self.done)} {clock(self.elapsed)} {label[:50]:<50}"
        self._bar = len(text)
        self.stream.write("\r" + text)
        self.stream.flush()

    def _flush_op(self) -> None:
        if self._op is not None and not self.tty and self.describe is None:
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
