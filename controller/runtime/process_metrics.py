"""Metrics of child processes (prometheus_client's multiprocess mode), bounded across restarts.

In multiprocess mode each process writes its values to files named after its pid
(`counter_<pid>.db`, `histogram_<pid>.db`, `gauge_<mode>_<pid>.db`) in a shared directory, and a
collector adds them up. A process that exits leaves its files behind (prometheus_client's
`mark_process_dead` removes only its `live*` gauges), so a child restarted N times leaves N sets
of files, and every scrape reads them all: a crash-looping child grows the directory and the
scrape without bound. `ChildMetrics.retire(pid)` folds a dead process's files into one set of
`<type>_retired.db` files (counters, histograms and summaries summed; `sum`, `max`, `min` and
`mostrecent` gauges combined as their mode says; `all` and `live*` gauges dropped, they describe
a process that is gone) and removes them: the files stay bounded by the live processes, and the
totals stay what they were (counters never go down). Collection and retirement exclude each
other, so a scrape never sees a dead process's values twice or not at all.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from prometheus_client import multiprocess
from prometheus_client.metrics_core import Metric
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.registry import Collector

RETIRED = "retired"
_SUMMED = ("counter", "histogram", "summary")
Sample = tuple[float, float]  # (value, timestamp)


def _sum(old: Sample, new: Sample) -> Sample:
    return (old[0] + new[0], max(old[1], new[1]))


def _most_recent(old: Sample, new: Sample) -> Sample:
    return new if new[1] >= old[1] else old


_GAUGE_MERGE: dict[str, Callable[[Sample, Sample], Sample]] = {
    "sum": _sum,
    "max": max,
    "min": min,
    "mostrecent": _most_recent,
}


class ChildMetrics(Collector):
    """The values of every process writing to `directory`, live or retired, added up."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self._collector = multiprocess.MultiProcessCollector(None, path=str(directory))  # type: ignore[no-untyped-call]
        self._lock = threading.Lock()

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            return list(self._collector.collect())  # type: ignore[no-untyped-call]

    def files(self) -> list[Path]:
        return sorted(self.directory.glob("*.db"))

    def retire(self, pid: int | str) -> None:
        """Fold the files of process `pid` (which has exited) into the retired files."""
        with self._lock:
            for path in self.directory.glob(f"*_{pid}.db"):
                kind, *mode = path.name[: -len(f"_{pid}.db")].split("_")
                if kind in _SUMMED and not mode:
                    self._merge(path, f"{kind}_{RETIRED}.db", None)
                elif kind == "gauge" and len(mode) == 1 and mode[0] in _GAUGE_MERGE:
                    self._merge(path, f"gauge_{mode[0]}_{RETIRED}.db", mode[0])
                path.unlink(missing_ok=True)

    def _merge(self, source: Path, target: str, gauge_mode: str | None) -> None:
        values = MmapedDict.read_all_values_from_file(str(source))  # type: ignore[no-untyped-call]
        retired = MmapedDict(str(self.directory / target))  # type: ignore[no-untyped-call]
        try:
            existing = {key for key, _, _ in retired.read_all_values()}  # type: ignore[no-untyped-call]
            for key, value, timestamp, _ in values:
                new: Sample = (value, timestamp)
                if key in existing:
                    old: Sample = retired.read_value(key)  # type: ignore[no-untyped-call]
                    new = _GAUGE_MERGE[gauge_mode or "sum"](old, new)
                retired.write_value(key, *new)  # type: ignore[no-untyped-call]
        finally:
            retired.close()  # type: ignore[no-untyped-call]
