"""Progress on stderr for anything that can take more than a few seconds: a compilation, a long loop.

    note(text)                     one line on stderr ("note: ..."), at once
    note_once(key, text)           the same, only the first time `key` is given in this process
    Progress(what, total, unit)    .step(n) / .close(): on a terminal one line redrawn with \\r
                                   ("what: 37/120 (12 s)"); elsewhere a start line and an end line

Nothing here touches stdout, so piped results stay clean.
"""

from __future__ import annotations

import sys
import time

__all__ = ["note", "note_once", "Progress"]

_noted: set[str] = set()


def note(text: str) -> None:
    """`text` as one line on stderr, flushed (so it shows before the wait it announces)."""
    print(f"note: {text}", file=sys.stderr, flush=True)


def note_once(key: str, text: str) -> bool:
    """note(text) unless `key` was noted before in this process; True when it printed."""
    if key in _noted:
        return False
    _noted.add(key)
    note(text)
    return True


class Progress:
    """Progress of `total` steps of `what` on stderr: a line redrawn in place on a terminal (at most 5 times a
    second), else one line at the start and one at the end with the elapsed time. Use as a context manager or
    call close()."""

    def __init__(self, what: str, total: int | None = None, *, unit: str = "steps", stream=None):
        self.what, self.total, self.done = what, total, 0
        self.stream = sys.stderr if stream is None else stream
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = self._last = time.perf_counter()
        self.closed = False
        if self.tty:
            self._write(self._line())
        else:
            of = f" ({total} {unit})" if total is not None else ""
            self._write(f"{what}{of}...\n")

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()

    def _line(self) -> str:
        of = f"/{self.total}" if self.total is not None else ""
        return f"{self.what}: {self.done}{of} ({time.perf_counter() - self.start:.0f} s)"

    def step(self, n: int = 1) -> None:
        self.done += n
        now = time.perf_counter()
        if self.tty and now - self._last >= 0.2:
            self._last = now
            self._write("\r" + self._line())

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.tty:
            self._write("\r" + self._line() + "\n")
        else:
            self._write(f"{self.what}: done in {time.perf_counter() - self.start:.1f} s\n")

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
