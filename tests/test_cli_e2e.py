"""End to end through the `fleetgate` command on the built-in simulator (real processes)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support import rules_leaving_frozen_to_people

ROOT = Path(__file__).resolve().parent.parent
FLEETGATE = [
    sys.executable,
    "-c",
    "import sys; from controller.service.cli import main; sys.exit(main())",
]


def fg(*args: str, check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([*FLEETGATE, *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, **kw)  # fmt: skip
    if check:
        assert out.returncode == 0, (
            f"fleetgate {' '.join(args)} exited {out.returncode}:\n{out.stderr[-2000:]}"
        )
    return out


def fast_config(tmp: Path) -> Path:
    """Fast ticks, and frozen instances left to people (so there is something to escalate)."""
    cfg = tmp / "fast.yaml"
    rules = rules_leaving_frozen_to_people(tmp / "rules")
    cfg.write_text(f"interval_s: 0.01\nrules: ['{rules}']\n")
    return cfg


@pytest.fixture(scope="module")
def run400(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("run400")
    cfg, state = fast_config(tmp), tmp / "state"
    out = fg("--config", str(cfg), "--state", str(state), "run", "--ticks", "400", "--seed", "7")
    assert "stopped after 400 tick(s) (0 failed)" in out.stderr
    return cfg, state


def actions(cfg: Path, state: Path) -> list[dict[str, Any]]:
    out = fg("--config", str(cfg), "--state", str(state), "actions", "--json", "--limit", "100000")
    rows: list[dict[str, Any]] = json.loads(out.stdout)
    return rows


def escalations(cfg: Path, state: Path) -> list[dict[str, Any]]:
    out = fg("--config", str(cfg), "--state", str(state), "escalations", "list", "--json")
    rows: list[dict[str, Any]] = json.loads(out.stdout)
    return rows


def test_400_ticks_do_the_routine_work_by_rules(run400: tuple[Path, Path]) -> None:
    rows = actions(*run400)
    ok = [r for r in rows if r["status"] == "ok"]
    by = {(r["action"], r["proposer"]) for r in ok}
    launches = [r for r in ok if r["action"] == "launch" and r["parent_id"] is not None]
    assert len(launches) >= 10 and len({r["result"]["instance"] for r in launches}) == len(launches)
    assert ("restart_daemon", "rule:restart-silently-exited-daemon") in by
    assert ("replace", "rule:replace-crash-looping-instance") in by
    crash = next(r for r in ok if r["proposer"] == "rule:replace-crash-looping-instance")
    assert crash["result"]["blocked_host"] and crash["result"]["replacement"]
    assert ("drain", "rule:scale-down-idle-instance") in by
    assert ("destroy", "rule:scale-down-idle-instance") in by
    assert ("destroy", "controller:replace") in by  # the old one goes once the new one runs
    assert all(r["why"] and r["proposer"] for r in rows)


def test_400_ticks_escalate_the_unknown_status_and_nothing_routine(
    run400: tuple[Path, Path],
) -> None:
    esc = escalations(*run400)
    unmatched = [e for e in esc if e["kind"] == "unmatched"]
    assert unmatched and all(e["situation"]["key"]["status"] == "frozen" for e in unmatched)
    routine = ("rule:scale-", "rule:restart-", "rule:replace-crash", "rule:destroy-dead")
    for e in esc:
        assert e["kind"] in ("unmatched", "sensing_failure"), e["summary"]
        assert not any(p["proposer"].startswith(routine) for p in e["situation"]["proposals"])
    lines = (run400[1] / "escalations.jsonl").read_text().splitlines()
    assert len(lines) == len(esc)
    assert json.loads(lines[0])["message"].count("escalations approve") >= 1


def test_explain_shows_rules_and_plan_and_changes_nothing(run400: tuple[Path, Path]) -> None:
    cfg, state = run400
    db = sqlite3.connect(state / "journal.db")
    count = (
        "SELECT (SELECT COUNT(*) FROM actions), (SELECT COUNT(*) FROM ticks), "
        "(SELECT COUNT(*) FROM escalations), (SELECT value FROM kv WHERE key='sim.state')"
    )
    before = db.execute(count).fetchone()
    text = fg("--config", str(cfg), "--state", str(state), "explain").stdout
    assert "matching rules:" in text and "plan:" in text and "would escalate:" in text
    # the fields rules use, as a rules file writes them (true/false, not Python's True/False)
    lines = text.splitlines()
    total = next(line for line in lines if line.startswith("  demand   demand:all "))
    assert "oldest_pending_s=" in total and "forecast_pending=" in total, total
    instances = [line for line in lines if line.startswith("  instance ")]
    assert instances and all("idle_for_s=" in line and "drained=" in line for line in instances)
    assert not any(word in text for word in ("=True", "=False")), text
    doc = json.loads(fg("--config", str(cfg), "--state", str(state), "explain", "--json").stdout)
    assert {"facts", "matches", "plan", "escalations"} <= set(doc)
    assert any(f["kind"] == "fleet" for f in doc["facts"])
    assert db.execute(count).fetchone() == before


def test_status_json(run400: tuple[Path, Path]) -> None:
    cfg, state = run400
    st = json.loads(fg("--config", str(cfg), "--state", str(state), "status", "--json").stdout)
    assert st["provider"] == "sim" and st["last_tick"]["id"] == 400
    assert st["instances"] >= 0 and "all" in st["demand"]


def test_status_text_reads_as_words_and_agrees_with_the_json(run400: tuple[Path, Path]) -> None:
    cfg, state = run400
    st = json.loads(fg("--config", str(cfg), "--state", str(state), "status", "--json").stdout)
    text = fg("--config", str(cfg), "--state", str(state), "status").stdout
    assert "{'" not in text and "[{" not in text, text  # no Python reprs of the tick's summary
    tick = next(line for line in text.splitlines() if line.startswith("last tick #400 at "))
    assert "sensors demand ok, provider ok" in tick and "doubts" in tick, tick
    demand = next(line for line in text.splitlines() if line.startswith("demand, "))
    total = st["demand"]["all"]
    assert f"all {total['pending']}/{total['running']}" in demand, demand
    assert "forecast of the two together" in demand, demand


def test_consecutive_ticks_continue_from_the_journal(tmp_path: Path) -> None:
    state = tmp_path / "s"
    for _ in range(3):
        fg("--state", str(state), "tick")
    db = sqlite3.connect(state / "journal.db")
    starts = [r[0] for r in db.execute("SELECT started_at FROM ticks ORDER BY id")]
    assert len(starts) == 3 and starts[1] - starts[0] == 60 and starts[2] - starts[1] == 60
    assert db.execute("SELECT COUNT(*) FROM actions WHERE action='launch'").fetchone()[0] >= 1


def test_a_human_approval_runs_through_the_guards_on_the_next_tick(tmp_path: Path) -> None:
    cfg, state = tmp_path / "patient.yaml", tmp_path / "s"
    rules = rules_leaving_frozen_to_people(tmp_path / "rules")
    cfg.write_text(f"interval_s: 0.01\nrules: ['{rules}']\nescalation: {{deadline_s: 864000}}\n")
    fg("--config", str(cfg), "--state", str(state), "run", "--ticks", "400", "--seed", "7")
    pending = [e for e in escalations(cfg, state) if e["status"] == "pending"]
    assert pending, "no escalation to answer"
    esc = pending[0]
    inst = esc["subject"].split(":")[1]
    bad = fg(
        "--config",
        str(cfg),
        "--state",
        str(state),
        "escalations",
        "approve",
        str(esc["id"]),
        "--action",
        "replace",
        "--param",
        "block_host=sometimes",
        check=False,
    )
    assert bad.returncode == 2 and "block_host" in bad.stderr
    answer = ("escalations", "approve", str(esc["id"]), "--action", "scale_to",
              "--param", "count=3")  # fmt: skip
    outside = fg("--config", str(cfg), "--state", str(state), *answer, check=False)
    assert outside.returncode == 2 and "not offered" in outside.stderr  # not this subject's
    fg(
        "--config",
        str(cfg),
        "--state",
        str(state),
        "escalations",
        "approve",
        str(esc["id"]),
        "--action",
        "replace",
        "--by",
        "ana",
    )
    again = fg(
        "--config",
        str(cfg),
        "--state",
        str(state),
        "escalations",
        "deny",
        str(esc["id"]),
        check=False,
    )
    assert again.returncode == 2 and "approved" in again.stderr
    fg("--config", str(cfg), "--state", str(state), "tick")
    rows = actions(cfg, state)
    mine = [r for r in rows if r["escalation_id"] == esc["id"] and r["parent_id"] is None]
    assert mine and mine[0]["action"] == "replace" and mine[0]["proposer"] == "human:ana"
    assert mine[0]["params"]["instance"] == inst and mine[0]["status"] == "ok"
    after = {e["id"]: e for e in escalations(cfg, state)}[esc["id"]]
    assert after["status"] == "executed" and after["executed_action_id"] == mine[0]["id"]


def test_stale_escalations_resolve_and_dedup_holds_while_pending(run400: tuple[Path, Path]) -> None:
    esc = escalations(*run400)
    by_subject: dict[str, list[dict[str, Any]]] = {}
    for e in esc:
        by_subject.setdefault(e["subject"], []).append(e)
    for subject, rows in by_subject.items():
        assert sum(1 for e in rows if e["status"] == "pending") <= 1, subject
    live = {
        f["id"]
        for f in json.loads(
            fg("--config", str(run400[0]), "--state", str(run400[1]), "explain", "--json").stdout
        )["facts"]
    }
    for e in esc:
        if e["status"] == "pending":
            assert e["subject"].split(":")[1] in live, f"stale pending escalation {e['id']}"


def finished_ticks(db: Path) -> int:
    """Ticks recorded as finished; 0 while the journal is still being created."""
    try:
        with sqlite3.connect(db) as conn:
            row = conn.execute("SELECT COUNT(*) FROM ticks WHERE finished_at IS NOT NULL")
            return int(row.fetchone()[0])
    except sqlite3.Error:
        return 0


def test_sigterm_finishes_the_current_tick_and_exits_cleanly(tmp_path: Path) -> None:
    cfg = tmp_path / "slow.yaml"
    cfg.write_text("interval_s: 0.5\n")
    state = tmp_path / "s"
    db_path = state / "journal.db"
    proc = subprocess.Popen(
        [*FLEETGATE, "--config", str(cfg), "--state", str(state), "run"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while finished_ticks(db_path) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:  # never leave the process (and its pipes) behind
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-1000:]
    assert "SIGTERM: finishing the current tick" in err and "stopped after" in err
    with sqlite3.connect(db_path) as conn:
        unfinished = conn.execute("SELECT COUNT(*) FROM ticks WHERE finished_at IS NULL")
        assert unfinished.fetchone()[0] == 0


def test_without_a_config_the_embedded_default_runs(tmp_path: Path) -> None:
    env = dict(os.environ, FLEETGATE_STATE=str(tmp_path / "s"))
    fg("run", "--ticks", "3", env=env)
    assert (tmp_path / "s" / "journal.db").exists()


def test_bench_sim_prints_numbers() -> None:
    doc = json.loads(fg("bench", "sim", "--ticks", "20", "--seed", "3", "--json").stdout)
    assert doc["ticks"] == 20 and doc["median_ms"] > 0 and doc["max_ms"] >= doc["median_ms"]
    assert doc["instances_launched"] >= 1


def test_the_simulator_can_replay_a_trace(tmp_path: Path) -> None:
    trace = ROOT / "tests" / "data" / "trace_slice.csv"
    cfg = tmp_path / "trace.yaml"
    cfg.write_text(
        "interval_s: 0.01\n"
        "sim:\n"
        f"  world: {{demand: trace, trace_path: '{trace}', trace_time_scale: 0.0005,\n"
        "          trace_service_scale: 0.001}\n"
    )
    state = tmp_path / "s"
    fg("--config", str(cfg), "--state", str(state), "run", "--ticks", "60", "--seed", "1")
    st = json.loads(fg("--config", str(cfg), "--state", str(state), "status", "--json").stdout)
    assert st["sim"]["tasks_arrived"] > 0
    assert any(r["action"] == "launch" for r in actions(cfg, state))


def test_a_crash_loop_its_supervisor_restarts_is_replaced_and_its_host_blocked(
    tmp_path: Path,
) -> None:
    """On a simulated world where supervisord starts cuzk again 2 s after it dies, a daemon on
    a crash-loop host is never seen down: the rule for a restarting daemon replaces it, and
    nothing is restarted by fleetgate."""
    cfg = fast_config(tmp_path)
    world = ("{supervised_restart_s: 2, crash_loop_host_fraction: 0.3, "
             "crash_loop_s: [120, 300], daemon_death_per_h: 0.0}")  # fmt: skip
    cfg.write_text(cfg.read_text() + f"sim: {{world: {world}}}\n")
    state = tmp_path / "state"
    out = fg("--config", str(cfg), "--state", str(state), "run", "--ticks", "300", "--seed", "7")
    assert "stopped after 300 tick(s) (0 failed)" in out.stderr
    done = [a for a in actions(cfg, state) if a["status"] == "ok"]
    looped = [a for a in done if a["action"] == "replace"
              and a["proposer"] == "rule:replace-instance-restarting-on-its-own"]  # fmt: skip
    assert looped and all(a["result"]["blocked_host"] for a in looped)
    assert [a for a in done if a["action"] == "restart_daemon"] == []
