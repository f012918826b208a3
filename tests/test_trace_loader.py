"""The trace loader: timestamp columns, service times as recorded (a floor only when asked),
row filters, the GPU-count column as a filter; and the `simulate` options that reach them."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from controller.service.cli import main
from controller.sim.trace import RowFilter, TraceTask, load_trace

pytestmark = pytest.mark.usefixtures("restore_logging")  # `main` re-points the root logger

# requests of a service log: a timestamp when it came, when it ended, how it ended
REQUESTS = """\
id,submitted,finished,state,gpus
a,2024-11-15 16:57:50,2024-11-15 16:58:10,ok,1
b,2024-11-15 16:58:50,2024-11-15 17:08:50,failed,1
c,2024-11-15 17:00:00,2024-11-15 17:00:45,ok,2
d,2024-11-15 17:01:30,2024-11-15 17:01:30,pending,1
e,2024-11-15 17:02:00,2024-11-15 17:12:00,ok,0
"""


def _requests(tmp_path: Path, text: str = REQUESTS) -> Path:
    path = tmp_path / "requests.csv"
    path.write_text(text)
    return path


def _load(path: Path, **options: object) -> list[TraceTask]:
    base: dict[str, object] = {"arrival_col": "submitted", "end_col": "finished",
                               "filter_gpu_col": None}  # fmt: skip
    return load_trace(path, **{**base, **options})  # type: ignore[arg-type]


def test_iso_like_timestamps_are_read_as_times(tmp_path: Path) -> None:
    got = _load(_requests(tmp_path))
    # arrivals 0, 60, 130, 220, 250 s after 16:57:50; lifetimes 20, 600, 45, 0, 600 s
    assert got == [TraceTask(0.0, 20.0), TraceTask(60.0, 600.0), TraceTask(130.0, 45.0),
                   TraceTask(220.0, 0.0), TraceTask(250.0, 600.0)]  # fmt: skip


def test_short_service_times_are_kept_as_recorded_unless_a_floor_is_asked(tmp_path: Path) -> None:
    path = _requests(tmp_path)
    assert [t.service_s for t in _load(path)] == [20.0, 600.0, 45.0, 0.0, 600.0]
    floored = _load(path, min_service_s=60.0)
    assert [t.service_s for t in floored] == [60.0, 600.0, 60.0, 60.0, 600.0]
    assert [t.service_s for t in _load(path, min_service_s=30.0, max_service_s=500.0)] == [
        30.0, 500.0, 45.0, 30.0, 500.0]  # fmt: skip
    with pytest.raises(ValueError, match="min_service_s 90.0 is above max_service_s 60.0"):
        _load(path, min_service_s=90.0, max_service_s=60.0)


def test_rows_are_filtered_by_equal_and_not_equal_conditions(tmp_path: Path) -> None:
    path = _requests(tmp_path)
    ok = _load(path, where=[RowFilter.parse("state=ok")])
    assert [t.service_s for t in ok] == [20.0, 45.0, 600.0]  # a, c, e; arrivals from a
    assert [t.arrival_s for t in ok] == [0.0, 130.0, 250.0]
    done = _load(path, where=[RowFilter.parse(w) for w in ("state != failed", "state!=pending")])
    assert done == ok
    # the first kept row sets time 0: without a, arrivals count from b
    later = _load(path, where=[RowFilter.parse("id!=a")])
    assert later[0] == TraceTask(0.0, 600.0) and len(later) == 4
    where = re.escape(str(path))
    with pytest.raises(ValueError, match=rf"^{where}:2: no column 'status' \(row filter\)$"):
        _load(path, where=[RowFilter.parse("status=ok")])


@pytest.mark.parametrize("text", ["state", "=ok", " != x", ""])
def test_a_malformed_row_filter_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="expected COL=VALUE or COL!=VALUE"):
        RowFilter.parse(text)


def test_the_gpu_column_is_a_filter_a_count_of_2_is_one_task(tmp_path: Path) -> None:
    got = _load(_requests(tmp_path), filter_gpu_col="gpus")
    # e (0 GPUs) is dropped; c (2 GPUs) is one task, as any other
    assert [t.arrival_s for t in got] == [0.0, 60.0, 130.0, 220.0]
    assert got[2] == TraceTask(130.0, 45.0)


def test_a_time_format_and_a_time_zone(tmp_path: Path) -> None:
    path = tmp_path / "local.csv"
    # day/month/year local times in Berlin (UTC+1 in November), one with an explicit offset
    path.write_text("at,until\n15/11/2024 17:00,15/11/2024 17:30\n15/11/2024 18:00 +0000,"
                    "15/11/2024 19:30 +0000\n")  # fmt: skip
    fmt = "%d/%m/%Y %H:%M"
    with pytest.raises(ValueError, match=r"local.csv:3: at '15/11/2024 18:00 \+0000' is not a"):
        load_trace(path, arrival_col="at", end_col="until", filter_gpu_col=None, time_format=fmt)
    path.write_text("at,until\n15/11/2024 17:00 +0100,15/11/2024 17:30 +0100\n"
                    "15/11/2024 18:00 +0000,15/11/2024 19:30 +0000\n")  # fmt: skip
    got = load_trace(path, arrival_col="at", end_col="until", filter_gpu_col=None,
                     time_format=fmt + " %z")  # fmt: skip
    assert got == [TraceTask(0.0, 1800.0), TraceTask(7200.0, 5400.0)]  # 16:00Z, then 18:00Z
    # ISO-like without an offset: in --tz; with one: as written
    path.write_text("at,until\n2024-11-15 17:00:00,2024-11-15 17:10:00\n"
                    "2024-11-15T18:00:00Z,2024-11-15T18:05:00Z\n")  # fmt: skip
    utc = load_trace(path, arrival_col="at", end_col="until", filter_gpu_col=None)
    berlin = load_trace(path, arrival_col="at", end_col="until", filter_gpu_col=None,
                        tz="Europe/Berlin")  # fmt: skip
    assert utc == [TraceTask(0.0, 600.0), TraceTask(3600.0, 300.0)]
    assert berlin == [TraceTask(0.0, 600.0), TraceTask(7200.0, 300.0)]  # 17:00 Berlin = 16:00Z
    with pytest.raises(ValueError, match="unknown time zone 'Mars/Olympus'"):
        load_trace(path, arrival_col="at", end_col="until", filter_gpu_col=None, tz="Mars/Olympus")


def test_a_bad_timestamp_names_path_line_and_the_expected_shape(tmp_path: Path) -> None:
    path = _requests(tmp_path, "submitted,finished\n2024-11-15 16:57:50,soon\n")
    where = re.escape(str(path))
    expected = "is not a number of seconds nor an ISO-like timestamp such as 2024-11-15 16:57:50"
    with pytest.raises(ValueError, match=rf"^{where}:2: finished 'soon' {expected}$"):
        _load(path)
    path = _requests(tmp_path, "submitted,finished\n2024-11-15 17:00:00,2024-11-15 16:00:00\n")
    with pytest.raises(ValueError, match=rf"^{where}:2: finished '2024-11-15 16:00:00' is before "
                       r"submitted '2024-11-15 17:00:00'$"):  # fmt: skip
        _load(path)


# --- the command


def test_simulate_reads_timestamps_filters_rows_and_floors_only_when_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _requests(tmp_path)
    base = ["simulate", "--trace", str(trace), "--arrival-col", "submitted", "--end-col",
            "finished", "--days", "0.05"]  # fmt: skip
    argv = [*base, "--gpu-col", "gpus", "--where", "state!=failed", "--where", "state!=pending",
            "--report", str(tmp_path / "r")]  # fmt: skip
    assert main(argv) == 0
    doc = json.loads((tmp_path / "r" / "report.json").read_text())
    assert doc["tasks"] == 2  # a and c: b failed, d pending, e has no GPU
    assert doc["trace"]["where"] == ["state!=failed", "state!=pending"]
    assert doc["trace"]["tz"] == "UTC" and doc["trace"]["min_service_s"] is None
    replayed = (tmp_path / "r" / "state" / "trace.csv").read_text().splitlines()[1:]
    lives = sorted(float(e) - float(a) for a, e, _ in (r.split(",") for r in replayed))
    assert lives == [20.0, 45.0]  # as recorded: no 60 s floor
    assert main([*base, "--gpu-col", "", "--min-service-s", "60", "--report",
                 str(tmp_path / "f")]) == 0  # fmt: skip
    replayed = (tmp_path / "f" / "state" / "trace.csv").read_text().splitlines()[1:]
    lives = sorted(float(e) - float(a) for a, e, _ in (r.split(",") for r in replayed))
    assert lives == [60.0, 60.0, 60.0, 600.0, 600.0]
    capsys.readouterr()


@pytest.mark.parametrize(("option", "message"), [
    (["--tz", "Mars/Olympus"], "--tz: unknown time zone 'Mars/Olympus'"),
    (["--where", "state"], "--where: row filter 'state': expected COL=VALUE or COL!=VALUE"),
    (["--min-service-s", "90", "--max-service-s", "60"],
     "--min-service-s must be >= 0 and at most --max-service-s, got 90.0"),
    # each was taken: a traceback once the horizon was counted in ticks, or nan service times
    (["--days", "nan"], "--days must be a finite number, got nan"),
    (["--days", "inf"], "--days must be a finite number, got inf"),
    (["--time-scale", "inf"], "--time-scale must be a finite number, got inf"),
    (["--deadline-s", "nan"], "--deadline-s must be a finite number, got nan"),
    (["--min-service-s", "nan"], "--min-service-s must be a finite number, got nan"),
    (["--service-scale", "nan"], "--service-scale must be a finite number, got nan"),
    (["--cooldown-s", "nan"], "--cooldown-s must be a finite number, got nan"),
])  # fmt: skip
def test_simulate_refuses_bad_loader_options(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             option: list[str], message: str) -> None:  # fmt: skip
    argv = ["simulate", "--trace", str(_requests(tmp_path)), *option, "--report",
            str(tmp_path / "r")]  # fmt: skip
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    "option",
    [
        ["--max-service-s", "600"],
        ["--where", "state!=failed"],
        ["--tz", "Europe/Berlin"],
        ["--time-scale", "2"],
    ],
)
def test_a_generated_shape_refuses_what_only_shapes_a_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: list[str]
) -> None:
    """Taken and ignored with --shape (report.json even recorded some as used)."""
    argv = ["simulate", "--shape", "short", "--days", "0.05", *option, "--report",
            str(tmp_path / "r")]  # fmt: skip
    assert main(argv) == 2
    assert f"{option[0]}: for a trace file only; --shape generates its tasks" in (
        capsys.readouterr().err)  # fmt: skip
    assert not (tmp_path / "r").exists()


def test_a_trace_whose_span_is_years_runs_only_when_days_asks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One arrival at epoch 0 beside 2024's (or milliseconds read as seconds): a run of decades,
    hours of wall time, without a word. Refused without --days; --days runs what it asks."""
    trace = tmp_path / "outlier.csv"
    trace.write_text("creation_time,deletion_time,num_gpu\n0,60,1\n1700000000,1700000060,1\n")
    report = tmp_path / "r"
    assert main(["simulate", "--trace", str(trace), "--report", str(report)]) == 2
    assert "the trace runs 19,676 days to its last arrival" in capsys.readouterr().err
    assert not report.exists()
    assert main(["simulate", "--trace", str(trace), "--days", "0.05", "--report",
                 str(report)]) == 0  # fmt: skip
    capsys.readouterr()


# --- the Standard Workload Format (the Parallel Workloads Archive's logs)

# a log as the archive writes one: `;` header comments, then 18 fields a job; -1 is unknown
SWF = """\
; Version: 2.2
; Computer: a test cluster
; UnixStartTime: 1400749079
; TimeZoneString: Europe/Luxembourg
;
    1      100     5    600   16  590  -1  16  3600  -1  1  1  1  1  1 -1 -1 -1
    2      160     0     40    1   39  -1   1   600  -1  0  2  2  2  1 -1 -1 -1
    3      220    -1     -1    4   -1  -1   4   600  -1  5  2  2  2  2 -1 -1 -1
    4       -1     0     90    1   -1  -1   1   600  -1  1  3  3  3  1 -1 -1 -1
    5      400    30   7200    8 7100  -1   8  7200  -1  1  1  1  1  1 -1 -1 -1
"""


def _swf(tmp_path: Path, name: str = "cluster.swf", text: str = SWF) -> Path:
    path = tmp_path / name
    if name.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def test_an_swf_log_is_read_by_submit_and_run_time_and_unknown_jobs_are_skipped(
    tmp_path: Path,
) -> None:
    # job 3 never ran (run time -1), job 4's submit time is unknown: both skipped
    want = [TraceTask(0.0, 600.0), TraceTask(60.0, 40.0), TraceTask(300.0, 7200.0)]
    assert load_trace(_swf(tmp_path)) == want
    assert load_trace(_swf(tmp_path, "cluster.swf.gz")) == want  # compressed, by its name
    assert load_trace(_swf(tmp_path, "cluster.log"), fmt="swf") == want  # any name, when told
    # its columns by the format's names: completed jobs only
    done = load_trace(_swf(tmp_path), where=[RowFilter.parse("status=1")])
    assert done == [TraceTask(0.0, 600.0), TraceTask(300.0, 7200.0)]
    # what is unknown is judged in the columns read: job 3 asked for 600 s
    asked = load_trace(_swf(tmp_path), service_col="requested_time")
    assert [t.service_s for t in asked] == [3600.0, 600.0, 600.0, 7200.0]
    with pytest.raises(ValueError, match="unknown trace format 'parquet'"):
        load_trace(_swf(tmp_path), fmt="parquet")


def test_an_swf_line_without_its_18_fields_names_path_and_line(tmp_path: Path) -> None:
    path = _swf(tmp_path, text=SWF.replace("  1 -1 -1 -1\n    5", "  1 -1 -1\n    5"))
    where = re.escape(str(path))
    with pytest.raises(ValueError, match=rf"^{where}:9: expected the 18 fields of a Standard "
                       r"Workload Format job, got 17$"):  # fmt: skip
        load_trace(path)
    # read as a CSV, the same file is no trace at all
    with pytest.raises(ValueError, match="no column"):
        load_trace(path, fmt="csv")


def test_simulate_replays_an_swf_log_with_its_own_columns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["simulate", "--trace", str(_swf(tmp_path, "cluster.log")), "--format", "swf",
            "--where", "status=1", "--days", "0.1", "--report", str(tmp_path / "r")]  # fmt: skip
    assert main(argv) == 0
    doc = json.loads((tmp_path / "r" / "report.json").read_text())
    assert doc["tasks"] == 2  # jobs 1 and 5
    assert doc["trace"]["format"] == "swf"
    assert (doc["trace"]["arrival_col"], doc["trace"]["service_col"]) == ("submit_time", "run_time")
    assert doc["trace"]["end_col"] is None and doc["trace"]["gpu_col"] is None
    replayed = (tmp_path / "r" / "state" / "trace.csv").read_text().splitlines()[1:]
    assert sorted(float(e) - float(a) for a, e, _ in (r.split(",") for r in replayed)) == [
        600.0, 7200.0]  # fmt: skip
    with pytest.raises(SystemExit) as refused:
        main(["simulate", "--trace", str(_swf(tmp_path)), "--format", "xml"])
    assert refused.value.code == 2 and "invalid choice: 'xml'" in capsys.readouterr().err


# --- files as other tools write them


def test_a_byte_order_mark_and_crlf_lines_are_read_as_the_plain_file(tmp_path: Path) -> None:
    # as a spreadsheet saves "CSV UTF-8": a byte order mark before the header, CRLF lines; the
    # mark was read into the first column's name ("no column 'id'" for a header showing id)
    text = "\ufeff" + REQUESTS.replace("\n", "\r\n")
    plain = _load(_requests(tmp_path))
    marked = tmp_path / "marked.csv"
    marked.write_bytes(text.encode())
    assert _load(marked) == plain
    assert _load(marked, where=[RowFilter.parse("id!=a")]) == _load(
        _requests(tmp_path), where=[RowFilter.parse("id!=a")])  # fmt: skip
    packed = tmp_path / "marked.csv.gz"
    packed.write_bytes(gzip.compress(text.encode()))
    assert _load(packed) == plain


def test_bytes_that_are_not_utf8_name_the_file_and_the_line(tmp_path: Path) -> None:
    # a row written as Latin-1 past the reader's first block: the error named neither the file
    # nor the line ("'utf-8' codec can't decode byte 0xe9 in position 6")
    rows = "".join(f"r{n},2024-11-15 16:57:50,2024-11-15 16:58:10,ok,1\n" for n in range(400))
    latin = tmp_path / "latin.csv"
    latin.write_bytes(
        ("id,submitted,finished,state,gpus\n" + rows).encode()
        + "caf\xe9,2024-11-15 17:00:00,2024-11-15 17:00:45,ok,1\n".encode("latin-1")
    )
    where = re.escape(str(latin))
    with pytest.raises(ValueError, match=rf"^{where}:402: not UTF-8 text \(byte 0xe9\); save"):
        _load(latin)
    packed = tmp_path / "latin.csv.gz"
    packed.write_bytes(gzip.compress(latin.read_bytes()))
    with pytest.raises(ValueError, match=rf"^{re.escape(str(packed))}:402: not UTF-8 text"):
        _load(packed)


def test_a_damaged_gzip_stream_is_named_as_a_cut_off_one_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    packed = bytearray(gzip.compress(REQUESTS.encode()))
    packed[10] = 0xFF  # the first deflate block's type: 3, which none is (zlib.error, a traceback)
    damaged = tmp_path / "requests.csv.gz"
    damaged.write_bytes(bytes(packed))
    with pytest.raises(ValueError, match=rf"^{re.escape(str(damaged))}: not a readable gzip file"):
        _load(damaged)
    cut = tmp_path / "cut.csv.gz"
    cut.write_bytes(gzip.compress(REQUESTS.encode())[:-12])
    with pytest.raises(ValueError, match=rf"^{re.escape(str(cut))}: not a readable gzip file"):
        _load(cut)
    argv = ["simulate", "--trace", str(damaged), "--report", str(tmp_path / "r")]
    assert main(argv) == 2
    assert "requests.csv.gz: not a readable gzip file" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_a_field_past_the_csv_readers_limit_names_the_file_and_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a pod's spec kept whole in a column: csv.Error is no ValueError, and simulate's traceback
    # named no line
    trace = tmp_path / "pods.csv"
    trace.write_text("spec,creation_time,deletion_time,num_gpu\n{},0,10,1\n"
                     f'"{{{"x" * 200_000}}}",5,20,1\n')  # fmt: skip
    where = re.escape(str(trace))
    with pytest.raises(ValueError, match=rf"^{where}:3: not a CSV row the reader takes \(field "
                       r"larger than field limit"):  # fmt: skip
        load_trace(trace)
    assert main(["simulate", "--trace", str(trace), "--report", str(tmp_path / "r")]) == 2
    assert f"{trace}:3: not a CSV row" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_a_quoted_field_may_hold_commas_and_line_breaks(tmp_path: Path) -> None:
    # a job's command line kept in a column, as csv writers quote it: the second line of the
    # field was read as a row of one field ("expected 5 fields, got 1")
    trace = tmp_path / "jobs.csv"
    trace.write_text(
        'id,command,creation_time,deletion_time,num_gpu\n'
        'a,"prove --sector 1, --fast",0,10,1\n'
        'b,"prove \\\n\n# still the command\n  --sector 2",5,20,1\n'
        '\n# a comment between rows\n'
        'c,prove,7,9,1\n'
        'd,"prove\n --sector 4",8,x,1\n'
    )  # fmt: skip
    assert load_trace(trace, limit=3) == [TraceTask(0.0, 10.0), TraceTask(5.0, 15.0),
                                          TraceTask(7.0, 2.0)]  # fmt: skip
    kept = load_trace(trace, where=[RowFilter.parse("id!=d"), RowFilter.parse("command!=prove")])
    assert kept == [TraceTask(0.0, 10.0), TraceTask(5.0, 15.0)]
    with pytest.raises(ValueError, match=rf"^{re.escape(str(trace))}:10: deletion_time 'x' is"):
        load_trace(trace)  # the row is named by its first line


def test_times_past_a_floats_range_once_scaled_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # each number is finite, their difference or its scaling is not: simulate ended in an
    # OverflowError counting the horizon in ticks
    trace = tmp_path / "huge.csv"
    trace.write_text("creation_time,deletion_time,num_gpu\n-1e308,0,1\n1e308,1e308,1\n")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(trace))}: its times, x the time and "
                       "service scales, are past any number of seconds"):  # fmt: skip
        load_trace(trace)
    trace.write_text("creation_time,deletion_time,num_gpu\n0,10,1\n1e300,1e300,1\n")
    assert load_trace(trace)[-1] == TraceTask(1e300, 0.0)
    argv = ["simulate", "--trace", str(trace), "--time-scale", "1e10", "--report",
            str(tmp_path / "r")]  # fmt: skip
    assert main(argv) == 2
    assert "huge.csv: its times, x the time and service scales" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
