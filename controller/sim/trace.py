"""Load a task trace (CSV) as arrivals and service times for the simulated queue.

The reference trace is Alibaba's `openb_pod_list_default.csv` (cluster-trace-gpu-v2023, Weng et
al., USENIX ATC 2023): one row per task with `creation_time` and `deletion_time` in seconds from
the trace start and `num_gpu`. Other CSVs name their own columns: an arrival time and either
an end time (`end_col`) or a duration (`service_col`, seconds). Blank lines and lines starting
with `#` are skipped; errors name `path:line`. A gzip-compressed file (`.csv.gz`, known by its
first bytes) is read as it is.

The traces shipped in `controller/sim/data/` (`SHIPPED`: the full openb trace, compressed, and
a one-day sample) are found by name alone too: a path with no folder that is no file in the
working directory, such as `openb_pod_list_default.csv.gz` (or `openb_pod_list_default.csv`),
is the packaged copy, so the documented commands also run from an installed package.

- Times (arrival, end) are numbers of seconds, or timestamps: ISO-like by default
  (`2024-11-15 16:57:50`, `2024-11-15T16:57:50+01:00`), else parsed with `time_format`
  (`strptime`); a timestamp without an offset is in `tz` (default UTC).
- `where`: row filters (`RowFilter`, from `COL=VALUE` or `COL!=VALUE`); a row is kept when it
  passes all of them (e.g. `status=finished`, or `status!=failed` and `status!=pending`).
- `filter_gpu_col`: a GPU-count column used as a filter only: rows where it is 0 (CPU-only
  tasks) are skipped; any other count is one task, as a proof takes one slot of an instance.
- Service times are taken as recorded, x `service_scale`: no floor unless `min_service_s` is
  given, no cap unless `max_service_s` is.
"""

from __future__ import annotations

import csv
import gzip
import io
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

DATA = Path(__file__).resolve().parent / "data"
SHIPPED = ("openb_pod_list_default.csv.gz", "openb_sample.csv")
_GZIP = b"\x1f\x8b"


@dataclass(frozen=True)
class TraceTask:
    """One task of the trace: when it arrives (s after the first) and how long it runs (s)."""

    arrival_s: float
    service_s: float


@dataclass(frozen=True)
class RowFilter:
    """Keep a row when its `column` equals `value` (or, with `negate`, differs from it)."""

    column: str
    value: str
    negate: bool = False

    @classmethod
    def parse(cls, text: str) -> RowFilter:
        """`COL=VALUE` or `COL!=VALUE` (spaces around either side are ignored)."""
        negate = "!=" in text
        column, sep, value = text.partition("!=" if negate else "=")
        if not sep or not column.strip():
            raise ValueError(f"row filter {text!r}: expected COL=VALUE or COL!=VALUE")
        return cls(column.strip(), value.strip(), negate)

    def keeps(self, record: dict[str, str], where: str) -> bool:
        if self.column not in record:
            raise ValueError(f"{where}: no column {self.column!r} (row filter)")
        return (record[self.column].strip() == self.value) is not self.negate

    def __str__(self) -> str:
        return f"{self.column}{'!=' if self.negate else '='}{self.value}"


def timezone_named(name: str) -> tzinfo:
    """The time zone `name` (an IANA name such as Europe/Berlin, or UTC); ValueError if unknown."""
    if name.upper() in ("UTC", "Z"):
        return UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"unknown time zone {name!r} (expected an IANA name or UTC)") from exc


@dataclass(frozen=True)
class _Times:
    """How the time columns are read."""

    time_format: str | None
    tz: tzinfo


def load_trace(
    path: str | Path,
    *,
    arrival_col: str = "creation_time",
    end_col: str = "deletion_time",
    service_col: str | None = None,
    filter_gpu_col: str | None = "num_gpu",
    time_scale: float = 1.0,
    service_scale: float = 1.0,
    min_service_s: float | None = None,
    max_service_s: float | None = None,
    time_format: str | None = None,
    tz: str = "UTC",
    where: Sequence[RowFilter] = (),
    limit: int | None = None,
) -> list[TraceTask]:
    """Tasks of the CSV at `path`, sorted by arrival (see the module docstring).

    Rows failing a `where` filter, and rows whose `filter_gpu_col` is 0, are skipped. Arrival is
    (arrival - the first kept arrival) x `time_scale`; service is the lifetime x
    `service_scale`, where the lifetime is the `service_col` value when one is named, else
    `end_col` - `arrival_col`; then at least `min_service_s` and at most `max_service_s` when
    those are given. `limit` keeps only the first `limit` kept rows of the file. Raises
    ValueError("path:line: ...") on a malformed row (ValueError on bad options) and OSError
    when the file cannot be read.
    """
    if min_service_s is not None and max_service_s is not None and min_service_s > max_service_s:
        raise ValueError(
            f"min_service_s {min_service_s!r} is above max_service_s {max_service_s!r}"
        )
    times = _Times(time_format, timezone_named(tz))
    rows: list[tuple[float, float]] = []
    for at, record in _records(Path(path)):
        if limit is not None and len(rows) >= limit:
            break
        if not all(f.keeps(record, at) for f in where):
            continue
        if filter_gpu_col is not None and _number(record, filter_gpu_col, at) == 0:
            continue
        start = _time(record, arrival_col, at, times)
        life = _lifetime(record, start, at, arrival_col, end_col, service_col, times)
        rows.append((start, life))
    if not rows:
        return []
    first = min(start for start, _ in rows)
    floor = 0.0 if min_service_s is None else min_service_s
    cap = math.inf if max_service_s is None else max_service_s
    tasks = [
        TraceTask((start - first) * time_scale, min(cap, max(floor, life * service_scale)))
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
    times: _Times,
) -> float:
    """The row's service time, seconds, before scaling (a duration column, or end - start)."""
    if service_col is not None:
        life = _number(record, service_col, where)
        if life < 0:
            raise ValueError(f"{where}: {service_col} {life!r} is negative")
        return life
    end = _time(record, end_col, where, times)
    if end < start:
        raise ValueError(f"{where}: {end_col} {record[end_col].strip()!r} is before "
                         f"{arrival_col} {record[arrival_col].strip()!r}")  # fmt: skip
    return end - start


def resolve(path: str | Path) -> Path:
    """`path`, or the shipped trace it names (a bare name that is no file here; see above)."""
    given = Path(path)
    if given.exists() or given.parent != Path("."):
        return given
    for name in (given.name, given.name + ".gz"):
        if name in SHIPPED and (DATA / name).is_file():
            return DATA / name
    return given


def _open(path: Path) -> io.TextIOBase:
    """The file as text, decompressed when it is gzip."""
    with path.open("rb") as probe:
        compressed = probe.read(2) == _GZIP
    if compressed:
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return path.open(newline="", encoding="utf-8")


def _records(path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """("path:line", {column: value}) for every data row, comments and blank lines skipped."""
    header: list[str] | None = None
    path = resolve(path)
    with _open(path) as handle:
        for lineno, line in enumerate(_lines(handle, path), start=1):
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


def _lines(handle: io.TextIOBase, path: Path) -> Iterator[str]:
    """The file's lines; a damaged or cut-off gzip stream is a ValueError naming the file."""
    try:
        yield from handle
    except (EOFError, gzip.BadGzipFile) as exc:
        raise ValueError(f"{path}: not a readable gzip file ({exc})") from None


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


def _time(record: dict[str, str], column: str, where: str, times: _Times) -> float:
    """A time column as epoch seconds: a number as it is, else a timestamp."""
    if column not in record:
        raise ValueError(f"{where}: no column {column!r}")
    raw = record[column].strip()
    if times.time_format is None:
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if math.isfinite(value):
            return value
    try:
        if times.time_format is not None:
            stamp = datetime.strptime(raw, times.time_format)
        else:
            stamp = datetime.fromisoformat(raw)
    except ValueError:
        shape = times.time_format or "an ISO-like timestamp such as 2024-11-15 16:57:50"
        raise ValueError(f"{where}: {column} {raw!r} is not a number of seconds nor "
                         f"{shape}") from None  # fmt: skip
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=times.tz)
    return stamp.timestamp()
