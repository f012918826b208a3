"""Load a task trace (CSV) as arrivals and service times for the simulated queue.

The reference trace is Alibaba's `openb_pod_list_default.csv` (cluster-trace-gpu-v2023, Weng et
al., USENIX ATC 2023): one row per task with `creation_time` and `deletion_time` in seconds from
the trace start and `num_gpu`. Other CSVs name their own columns: an arrival time and either
an end time (`end_col`) or a duration (`service_col`). Blank lines and lines starting with `#`
are skipped; errors name `path:line`.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

MIN_SERVICE_S = 60.0


@dataclass(frozen=True)
class TraceTask:
    """One task of the trace: when it arrives (s after the first) and how long it runs (s)."""

    arrival_s: float
    service_s: float


def load_trace(
    path: str | Path,
    *,
    arrival_col: str = "creation_time",
    end_col: str = "deletion_time",
    service_col: str | None = None,
    filter_gpu_col: str | None = "num_gpu",
    time_scale: float = 1.0,
    service_scale: float = 1.0,
    max_service_s: float | None = None,
    limit: int | None = None,
) -> list[TraceTask]:
    """Tasks of the CSV at `path`, sorted by arrival.

    Rows whose `filter_gpu_col` is 0 are skipped (CPU-only tasks). Arrival is (arrival - the
    first kept arrival) x `time_scale`; service is max(60, lifetime x `service_scale`), where
    the lifetime is the `service_col` value when one is named, else `end_col` - `arrival_col`,
    and at most `max_service_s` when that is given.
    `limit` keeps only the first `limit` kept rows of the file. Raises ValueError("path:line: ...")
    on a malformed row and OSError when the file cannot be read.
    """
    rows: list[tuple[float, float]] = []
    for where, record in _records(Path(path)):
        if limit is not None and len(rows) >= limit:
            break
        if filter_gpu_col is not None and _number(record, filter_gpu_col, where) == 0:
            continue
        start = _number(record, arrival_col, where)
        rows.append((start, _lifetime(record, start, where, arrival_col, end_col, service_col)))
    if not rows:
        return []
    first = min(start for start, _ in rows)
    cap = math.inf if max_service_s is None else max(max_service_s, MIN_SERVICE_S)
    tasks = [
        TraceTask((start - first) * time_scale, min(cap, max(MIN_SERVICE_S, life * service_scale)))
        for start, life in rows
    ]
    return sorted(tasks, key=lambda t: t.arrival_s)


def _lifetime(
    record: dict[str, str],
    start: float,
    where: str,
    arrival_col: str,
    end_col: str,
    service_col: str | None,
) -> float:
    """The row's service time, seconds, before scaling (a duration column, or end - start)."""
    if service_col is not None:
        life = _number(record, service_col, where)
        if life < 0:
            raise ValueError(f"{where}: {service_col} {life!r} is negative")
        return life
    end = _number(record, end_col, where)
    if end < start:
        raise ValueError(f"{where}: {end_col} {end!r} is before {arrival_col} {start!r}")
    return end - start


def _records(path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """("path:line", {column: value}) for every data row, comments and blank lines skipped."""
    header: list[str] | None = None
    with path.open(newline="", encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, start=1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            where = f"{path}:{lineno}"
            fields = next(csv.reader([line]))
            if header is None:
                header = [f.strip() for f in fields]
                continue
            if len(fields) != len(header):
                raise ValueError(f"{where}: expected {len(header)} fields, got {len(fields)}")
            yield where, dict(zip(header, fields, strict=True))


def _number(record: dict[str, str], column: str, where: str) -> float:
    if column not in record:
        raise ValueError(f"{where}: no column {column!r}")
    raw = record[column].strip()
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ValueError(f"{where}: {column} {raw!r} is not a number")
    return value
