"""Load a task trace (CSV or SWF) as arrivals and service times for the simulated queue.

The reference trace is Alibaba's `openb_pod_list_default.csv` (cluster-trace-gpu-v2023, Weng et
al., USENIX ATC 2023): one row per task with `creation_time` and `deletion_time` in seconds from
the trace start and `num_gpu`. Other CSVs name their own columns: an arrival time and either
an end time (`end_col`) or a duration (`service_col`, seconds). Blank lines and lines starting
with `#` are skipped between rows (a quoted field may hold commas and line breaks); errors name
`path:line`, a row's first line. A gzip-compressed file (`.csv.gz`, known by its first bytes)
is read as it is.

The Standard Workload Format of the Parallel Workloads Archive (`.swf`, or `fmt="swf"`; the
archive's cluster logs, and those packages ship) is read too: `;` comment lines, then 18
whitespace-separated fields a job, named as in `SWF_COLUMNS` (`submit_time`, `wait_time`,
`run_time`, `status`, ...). Its defaults are `submit_time` for the arrival and `run_time` for
the service time, with no GPU filter; a job whose submit or run time is -1 (the format's
"unknown") is skipped.

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
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from enum import Enum
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

DATA = Path(__file__).resolve().parent / "data"
SHIPPED = ("openb_pod_list_default.csv.gz", "openb_sample.csv")
_GZIP = b"\x1f\x8b"

# The Standard Workload Format's 18 fields, in order (Chapin et al., "Benchmarks and Standards
# for the Evaluation of Parallel Job Schedulers", 1999; the Parallel Workloads Archive's
# definition): times in seconds, -1 where a log does not know a value.
SWF_COLUMNS = (
    "job_number", "submit_time", "wait_time", "run_time", "allocated_processors",
    "average_cpu_time", "used_memory", "requested_processors", "requested_time",
    "requested_memory", "status", "user_id", "group_id", "executable_number", "queue_number",
    "partition_number", "preceding_job_number", "think_time",
)  # fmt: skip
SWF_UNKNOWN = "-1"
FORMATS = ("csv", "swf")


@dataclass(frozen=True)
class Columns:
    """Which columns a trace is read by: an arrival; an end or a duration (`service`); a
    GPU-count filter, or None."""

    arrival: str
    end: str | None
    service: str | None
    gpu: str | None


class _Default(Enum):
    FORMAT = "the format's default"


FORMAT_DEFAULT = _Default.FORMAT  # a GPU filter left to the trace's format


def trace_format(path: str | Path, fmt: str | None = None) -> str:
    """`fmt` when given (one of FORMATS), else by the file's name: `.swf` or `.swf.gz` is SWF,
    anything else CSV. ValueError on an unknown `fmt`."""
    if fmt is not None:
        if fmt not in FORMATS:
            raise ValueError(f"unknown trace format {fmt!r} (expected one of {', '.join(FORMATS)})")
        return fmt
    name = Path(path).name.lower()
    return "swf" if name.endswith((".swf", ".swf.gz")) else "csv"


def columns(
    fmt: str,
    arrival_col: str | None = None,
    end_col: str | None = None,
    service_col: str | None = None,
    filter_gpu_col: str | None | _Default = FORMAT_DEFAULT,
) -> Columns:
    """The columns to read, the format's defaults where none is named: for CSV the openb
    trace's (`creation_time`, `deletion_time`, `num_gpu`), for SWF `submit_time` and
    `run_time`, no GPU filter. A named `service_col` is read instead of any end column."""
    swf = fmt == "swf"
    default_gpu = None if swf else "num_gpu"
    gpu = default_gpu if isinstance(filter_gpu_col, _Default) else filter_gpu_col
    if service_col is None and end_col is None and swf:
        service_col = "run_time"
    end = None if service_col is not None else (end_col or "deletion_time")
    arrival = arrival_col or ("submit_time" if swf else "creation_time")
    return Columns(arrival, end, service_col, gpu or None)


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
    arrival_col: str | None = None,
    end_col: str | None = None,
    service_col: str | None = None,
    filter_gpu_col: str | None | _Default = FORMAT_DEFAULT,
    fmt: str | None = None,
    time_scale: float = 1.0,
    service_scale: float = 1.0,
    min_service_s: float | None = None,
    max_service_s: float | None = None,
    time_format: str | None = None,
    tz: str = "UTC",
    where: Sequence[RowFilter] = (),
    limit: int | None = None,
) -> list[TraceTask]:
    """Tasks of the trace at `path` (`fmt`: see `trace_format`), sorted by arrival (see the
    module docstring). Columns not named are the format's (`columns`); `filter_gpu_col=None`
    keeps every row.

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
    form = trace_format(path, fmt)
    cols = columns(form, arrival_col, end_col, service_col, filter_gpu_col)
    unknown = (cols.arrival, cols.service or cols.end) if form == "swf" else ()
    rows: list[tuple[float, float]] = []
    for at, record in _records(Path(path), form):
        if limit is not None and len(rows) >= limit:
            break
        if not all(f.keeps(record, at) for f in where):
            continue
        if any(record.get(c, "").strip() == SWF_UNKNOWN for c in unknown if c):
            continue
        if cols.gpu is not None and _number(record, cols.gpu, at) == 0:
            continue
        start = _time(record, cols.arrival, at, times)
        life = _lifetime(record, start, at, cols, times)
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
    if not all(math.isfinite(t.arrival_s) and math.isfinite(t.service_s) for t in tasks):
        raise ValueError(f"{resolve(path)}: its times, x the time and service scales, are past "
                         "any number of seconds (a float's range)")  # fmt: skip
    return sorted(tasks, key=lambda t: t.arrival_s)


def _lifetime(
    record: dict[str, str], start: float, where: str, cols: Columns, times: _Times
) -> float:
    """The row's service time, seconds, before scaling (a duration column, or end - start)."""
    if cols.service is not None:
        life = _number(record, cols.service, where)
        if life < 0:
            raise ValueError(f"{where}: {cols.service} {life!r} is negative")
        return life
    end_col = cols.end or "deletion_time"  # `columns` names one when there is no service
    end = _time(record, end_col, where, times)
    if end < start:
        raise ValueError(f"{where}: {end_col} {record[end_col].strip()!r} is before "
                         f"{cols.arrival} {record[cols.arrival].strip()!r}")  # fmt: skip
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
    """The file as UTF-8 text (a byte order mark at its start dropped), decompressed when it is
    gzip."""
    with path.open("rb") as probe:
        compressed = probe.read(2) == _GZIP
    if compressed:
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8-sig", newline="")
    return path.open(newline="", encoding="utf-8-sig")


def _records(path: Path, fmt: str = "csv") -> Iterator[tuple[str, dict[str, str]]]:
    """("path:line", {column: value}) for every data row, comments and blank lines skipped; a
    CSV row whose quoted field holds a line break is read whole, named by its first line."""
    header: list[str] | None = None
    path = resolve(path)
    with _open(path) as handle:
        numbered = enumerate(_lines(handle, path), start=1)
        if fmt == "swf":
            for lineno, line in numbered:
                if line.strip() and not line.lstrip().startswith(";"):
                    yield f"{path}:{lineno}", _swf_record(line, f"{path}:{lineno}")
            return
        for lineno, fields in _csv_rows(numbered, path):
            where = f"{path}:{lineno}"
            if header is None:
                header = [f.strip() for f in fields]
                continue
            if len(fields) != len(header):
                raise ValueError(f"{where}: expected {len(header)} fields, got {len(fields)}")
            yield where, dict(zip(header, fields, strict=True))


def _csv_rows(numbered: Iterator[tuple[int, str]], path: Path) -> Iterator[tuple[int, list[str]]]:
    """(first line, fields) of each CSV row, blank and `#` lines between rows skipped (inside a
    quoted field they are its text)."""
    first = 0  # the line the row being read starts on; 0 between rows

    def between_rows() -> Iterator[str]:
        nonlocal first
        for lineno, line in numbered:
            if not first and (not line.strip() or line.lstrip().startswith("#")):
                continue
            first = first or lineno
            yield line

    reader = csv.reader(between_rows())
    while True:
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:  # a field past csv's limit (128 KiB): not a ValueError
            raise ValueError(f"{path}:{first}: not a CSV row the reader takes ({exc})") from None
        yield first, fields
        first = 0


def _swf_record(line: str, where: str) -> dict[str, str]:
    """One SWF job line as {SWF column: value}."""
    fields = line.split()
    if len(fields) != len(SWF_COLUMNS):
        raise ValueError(f"{where}: expected the {len(SWF_COLUMNS)} fields of a Standard "
                         f"Workload Format job, got {len(fields)}")  # fmt: skip
    return dict(zip(SWF_COLUMNS, fields, strict=True))


def _lines(handle: io.TextIOBase, path: Path) -> Iterator[str]:
    """The file's lines; a damaged or cut-off gzip stream is a ValueError naming the file, and
    bytes that are not UTF-8 one naming its line."""
    try:
        yield from handle
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise ValueError(f"{path}: not a readable gzip file ({exc})") from None
    except UnicodeDecodeError as exc:
        bad = exc.object[exc.start : exc.start + 1].hex()
        raise ValueError(f"{path}:{_undecodable_line(path)}: not UTF-8 text (byte 0x{bad}); "
                         "save the trace as UTF-8") from None  # fmt: skip


def _undecodable_line(path: Path) -> int:
    """The number of the first line of `path` that is not UTF-8 (the text reader decodes a
    block at a time, so its error tells no line)."""
    with path.open("rb") as probe:
        compressed = probe.read(2) == _GZIP
    lineno = 0
    with gzip.open(path, "rb") if compressed else path.open("rb") as raw:
        for lineno, line in enumerate(raw, start=1):  # noqa: B007 (the last one is returned)
            try:
                line.decode("utf-8")
            except UnicodeDecodeError:
                return lineno
    return lineno


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
