"""How much resident memory this process gained over a block, at its peak (Linux /proc).

    with PeakRss() as rss:
        ...                       # a download that must stay bounded
    assert rss.growth < 8 * MiB

The kernel's peak (``VmHWM``) is reset on entry by writing ``5`` to ``/proc/self/clear_refs``;
where that is not allowed, a thread samples ``VmRSS`` every millisecond instead. Either way the
growth is the peak over the block minus the resident size on entry: what the block cost at
worst, whatever it freed before the end.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from types import TracebackType
from typing import Self

MiB = 1024 * 1024
_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_kib(field: str) -> int:
    found = re.search(rf"^{field}:\s+(\d+) kB$", _STATUS.read_text(), re.MULTILINE)
    if found is None:
        raise RuntimeError(f"{_STATUS} has no {field}")
    return int(found.group(1))


def resident_bytes() -> int:
    """This process's resident set size now."""
    return _status_kib("VmRSS") * 1024


class PeakRss:
    """The peak resident memory over a ``with`` block, as growth over its start (`growth`)."""

    def __init__(self) -> None:
        self.start = 0
        self.peak = 0
        self._sampler: threading.Thread | None = None
        self._done = threading.Event()

    @property
    def growth(self) -> int:
        """Bytes the peak rose above the resident size on entry (0 if it never did)."""
        return max(0, self.peak - self.start)

    def __enter__(self) -> Self:
        try:
            _CLEAR_REFS.write_text("5")
        except OSError:
            self._sampler = threading.Thread(target=self._sample, daemon=True)
        self.start = resident_bytes()
        self.peak = self.start
        if self._sampler is not None:
            self._sampler.start()
        return self

    def _sample(self) -> None:
        while not self._done.wait(0.001):
            self.peak = max(self.peak, resident_bytes())

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._sampler is not None:
            self._done.set()
            self._sampler.join()
            self.peak = max(self.peak, resident_bytes())
        else:
            self.peak = max(self.peak, _status_kib("VmHWM") * 1024)
