"""The reads a tick makes keep to indexes on the tables that grow with every month of running.

A journal a year old holds hundreds of thousands of ticks, events, actions and demand rows, and
every escalation and agent command ever answered. A tick that walked one of those tables would
slow down for as long as the journal lives; this asks SQLite how it would run each statement a
simulated tick sent (its expanded text, `EXPLAIN QUERY PLAN`, on a second connection).
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from controller.service.assemble import assemble
from controller.service.config import load_config
from controller.sim.trace import TraceTask
from controller.tools.replay.run import trace_config, write_tasks

ROOT = Path(__file__).resolve().parents[2]
SIMULATE = ROOT / "controller" / "examples" / "simulate.yaml"
# the tables that grow as long as fleetgate runs (the others hold one row per live thing)
GROWING = ("actions", "deliveries", "demand_history", "escalations", "events",
           "instance_commands", "instance_logs", "llm_calls", "outbox", "ticks")  # fmt: skip


def walks(plan: list[str]) -> list[str]:
    """The growing tables a plan reads from end to end (a table or a whole index of it)."""
    out = []
    for step in plan:
        words = step.split()
        if len(words) >= 2 and words[0] == "SCAN" and words[1] in GROWING:
            out.append(step)
    return out


def test_walks_reads_a_plans_scan_and_not_its_search() -> None:
    assert walks(["SCAN escalations"]) == ["SCAN escalations"]
    assert walks(["SCAN events USING INDEX events_at"]) == ["SCAN events USING INDEX events_at"]
    assert walks(["SEARCH escalations USING INDEX escalations_answered (answered_at>?)",
                  "USE TEMP B-TREE FOR ORDER BY", "SCAN kv"]) == []  # fmt: skip


def test_a_ticks_reads_walk_no_table_that_grows(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    trace = state / "trace.csv"
    write_tasks(trace, [TraceTask(60.0 * n, 900.0) for n in range(12)])
    app = assemble(trace_config(load_config(str(SIMULATE)), trace), state=state,
                   clock=time.time, sleep=time.sleep, seed=5)  # fmt: skip
    sent: list[str] = []
    try:
        controller = app.controller
        controller.tick()
        now = controller.clock()
        with app.journal.tx() as db:  # what a journal that has run a while also holds
            db.execute(
                "INSERT INTO escalations(fingerprint, kind, subject, summary, created_at, "
                "deadline, status, situation, default_action, answered_by, answered_at) "
                "VALUES ('f', 'k', 's', 'x', ?, ?, 'denied', '{}', '{}', 'human:a', ?)",
                (now - 900, now + 900, now - 60),
            )
            db.execute(
                "INSERT INTO instance_commands(label, command, created_at, deadline, "
                "picked_at, done_at) VALUES ('fg-old', 'restart_daemon', ?, ?, ?, ?)",
                (now - 900, now - 600, now - 850, now - 800),
            )
        db_file = app.journal.path
        assert db_file is not None
        app.journal.store._db.set_trace_callback(sent.append)  # type: ignore[attr-defined]
        for _ in range(30):
            controller.tick()
    finally:
        app.journal.store._db.set_trace_callback(None)  # type: ignore[attr-defined]
        app.close()
    reads = sorted({s for s in sent if s.lstrip().upper().startswith(("SELECT", "WITH"))})
    assert len(reads) > 20  # the tick's own reads were seen
    texts = " ".join(reads)
    assert "answered_at >=" in texts and "instance_commands" in texts  # the reads at issue
    other = sqlite3.connect(f"file:{db_file}?mode=ro", uri=True)
    try:
        walked = {}
        for statement in reads:
            plan = [str(r[3]) for r in other.execute("EXPLAIN QUERY PLAN " + statement)]
            if walks(plan):
                walked[" ".join(statement.split())[:160]] = walks(plan)
    finally:
        other.close()
    assert walked == {}
