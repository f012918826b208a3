"""Shared test helpers: rulebooks from text, facts over healthy defaults, a simulator without
faults."""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from controller.core.model import Demand, Instance
from controller.fleet.base import LaunchRequest
from controller.rules.engine import Engine
from controller.rules.rulebook import Rulebook, load_texts
from controller.rules.ruletest import DEFAULTS
from controller.store.backend import JournalError, PostgresStore
from controller.store.journal import Journal
from controller.tools.bench.world import AcceptingFleet
from escalation.render import iso8601


def book_of(text: str, path: str = "rules/test.yaml") -> Rulebook:
    return load_texts([(path, text)])


def engine_of(text: str) -> Engine:
    return Engine(book_of(text))


def fact(kind: str, id: str | None = None, **fields: Any) -> dict[str, Any]:
    """A fact of `kind` over healthy defaults (a serving instance, an empty queue)."""
    default_id = {"fleet": "fleet", "demand": "demand:all"}.get(kind, f"{kind}-x")
    out = {"kind": kind, **DEFAULTS[kind], **fields}
    out["id"] = id or (f"sensor:{out['name']}" if kind == "sensor" else default_id)
    return out


# Data-file tests (tests/data/rules, tests/data/config): each bad file states what it expects in
# `# expect: LINE: TEXT` lines; a `# xfail: REASON` line marks a known, not yet fixed defect.
ROOT = Path(__file__).resolve().parents[1]

NO_FAULTS: dict[str, Any] = {  # SimConfig fields: nothing dies, sticks, freezes or is slow
    "stuck_fraction": 0.0,
    "daemon_death_per_h": 0.0,
    "exit_per_h": 0.0,
    "offline_per_h": 0.0,
    "frozen_per_h": 0.0,
    "odd_status_per_h": 0.0,
    "crash_loop_host_fraction": 0.0,
    "slow_host_fraction": 0.0,
}
# the same, as a config's `sim: {world: {...}}` flow mapping
NO_FAULTS_YAML = ", ".join(f"{k}: {v}" for k, v in NO_FAULTS.items())
# a rule that asks people about the fleet at every tick: an escalation a test can count on
ASK_ABOUT_THE_FLEET = """\
rules:
  - name: ask-about-the-fleet
    description: The operators look at the fleet themselves, every time.
    when:
      fleet: {instances: {gte: 0}}
    then: {action: escalate, reason: "the fleet has {{ fleet.instances }} instance(s)"}
    confidence: 0.9
"""
EXPECT = re.compile(r"^# expect: (\d+): (.+)$", re.MULTILINE)
XFAIL = re.compile(r"^# xfail: (.+)$", re.MULTILINE)


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def cases(paths: Sequence[Path]) -> list[Any]:
    """One pytest param per data file, strictly xfailed where it names a known defect."""
    out = []
    for path in paths:
        known_bug = XFAIL.search(read(path))
        marks = [pytest.mark.xfail(strict=True, reason=known_bug[1])] if known_bug else []
        out.append(pytest.param(path, id=path.stem, marks=marks))
    return out


# The sample escalation both the template tests and the channel tests use.
RAISED_AT = 1_714_564_800.0  # 2024-05-01T12:00:00Z: rendered text is the same on every run


def sample_esc(now: float = RAISED_AT, **changes: Any) -> dict[str, Any]:
    """A typical escalation as templates and channels receive it, raised at `now`, due in 30 min."""
    esc: dict[str, Any] = {
        "id": 12,
        "kind": "unmatched",
        "subject": "instance:10007",
        "summary": "Instance 10007 is frozen and no rule covers it.",
        "fingerprint": "1a2b3c4d5e6f7a8b",
        "created_at_iso": iso8601(now),
        "deadline_iso": iso8601(now + 1800),
        "default_action": {"action": "hold", "params": {"reason": "nobody answered"}},
        "proposals": [
            {
                "action": "replace_instance",
                "params": {"instance": "10007"},
                "proposer": "llm:qwen",
                "confidence": 0.42,
                "reason": "frozen for 20 min after a reboot",
            }
        ],
        "facts": [{"type": "instance", "id": "10007", "status": "frozen", "label": "fg a1"}],
        "recent_actions": [
            {
                "at": now,
                "action": "reboot",
                "params": {"instance": "10007"},
                "status": "ok",
                "proposer": "rule:frozen-reboot",
            }
        ],
        "fleet": {"running": 10, "frozen": 1, "spend_per_h": 4.5, "pending_tasks": 30},
        "budget": {"spend_left_per_h": 5.5, "launches_left_1h": 3},
        "allowed_actions": ["hold", "reboot", "replace_instance"],
    }
    esc.update(changes)
    return esc


# The journal's two backends. PostgreSQL comes from FLEETGATE_TEST_PG_DSN (default: the local
# trust-auth server); each journal gets a schema of its own, dropped afterwards.
PG_DSN = os.environ.get(
    "FLEETGATE_TEST_PG_DSN", "host=127.0.0.1 port=5432 dbname=test user=postgres"
)
BACKENDS = ["sqlite", "postgres"]  # for `journal_on`


def pg_store(schema: str | None = None) -> PostgresStore:
    try:
        return PostgresStore(PG_DSN, schema or f"fg_test_{secrets.token_hex(6)}")
    except JournalError as exc:
        pytest.fail(f"test PostgreSQL unreachable at {PG_DSN!r} ({exc}); start it or point "
                    "FLEETGATE_TEST_PG_DSN at one", pytrace=False)  # fmt: skip


@contextmanager
def journal_on(kind: str, tmp_path: Path) -> Iterator[Journal]:
    """A fresh journal on `kind` ("sqlite" or "postgres"), removed afterwards."""
    if kind == "sqlite":
        j = Journal(tmp_path / "journal.db")
        yield j
        j.close()
        return
    store = pg_store()
    j = Journal(store)
    try:
        yield j
    finally:
        store.drop()
        store.close()


def peer(j: Journal) -> Journal:
    """A second connection to `j`'s store, as another process (or controller) would have."""
    if isinstance(j.store, PostgresStore):
        return Journal(PostgresStore(j.store._dsn, j.store.schema))
    assert j.path is not None
    return Journal(j.path)


class FakeClock:
    """The controller's clock (epoch seconds), virtual: only the test moves it, and the sleeps
    of whatever it is handed to as `sleep` (the vast client's pacing and backoff)."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)


def record_action(j: Any, now: float, action: str = "reboot", target: str = "instance:7",
                  **kw: object) -> int:  # fmt: skip
    """One row in `j.actions` with plain defaults (an executed intent unless `kw` says)."""
    fields: dict[str, object] = dict(tick_id=1, now=now, action=action, target=target,
                                     params={}, proposer="p", reason="r", confidence=1.0,
                                     verdict="act", why="w", status="intent")  # fmt: skip
    fields.update(kw)
    row: int = j.actions.record(**fields)
    return row


@contextmanager
def served(app: Any, journal: Journal) -> Iterator[str]:
    """`app` on a loopback port, for as long as the block runs: its base URL. On the way out
    the server stops and `journal` closes."""
    from controller.service.api import Server

    server = Server(app, "127.0.0.1", 0)
    server.start()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        server.stop()
        journal.close()


def rules_leaving_frozen_to_people(where: Path) -> Path:
    """The shipped rules in `where`, without `replace-frozen-instance` and its grace time: a
    frozen instance on the simulator is then unmatched and escalated (the situation the
    escalation tests need; the shipped rules replace it)."""
    import yaml

    from controller.rules.source import shipped_rules

    where.mkdir(parents=True, exist_ok=True)
    for path in sorted(shipped_rules().glob("*.yaml")):
        (where / path.name).write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    doc = yaml.safe_load((where / "lifecycle.yaml").read_text(encoding="utf-8"))
    doc["rules"] = [r for r in doc["rules"] if r["name"] != "replace-frozen-instance"]
    doc["normal"]["instance"] = [n for n in doc["normal"]["instance"]
                                 if n.get("status") != "frozen"]  # fmt: skip
    (where / "lifecycle.yaml").write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return where


def app_on_rules_copy(tmp_path: Path) -> tuple[Any, Path]:
    """A controller on the simulator (seed 7, real clock) over a copy of the shipped rules in
    `tmp_path / "rules"`, which a test then edits as a person would; state in `tmp_path`."""
    import time

    from controller.service.assemble import assemble
    from controller.service.config import Config

    rules = tmp_path / "rules"
    rules.mkdir()
    root = Path(__file__).resolve().parents[1]
    for f in (root / "rules").glob("*.yaml"):
        (rules / f.name).write_text(f.read_text())
    app = assemble(Config(), state=tmp_path / "state", clock=time.time, sleep=time.sleep,
                   seed=7, rules=[str(rules)])  # fmt: skip
    return app, rules


class SimApps:
    """Controllers on the simulator (seed 7, real clock) for one test, state in `where`:
    `make(config)` assembles one, on rules that leave frozen instances to people unless the
    config names rules of its own; `close()` closes every one made."""

    def __init__(self, where: Path) -> None:
        self.where = where
        self.made: list[Any] = []

    def make(self, config: Any) -> Any:
        import time

        from controller.service.assemble import assemble

        if not config.rules:  # frozen instances escalated, not replaced by the shipped rule
            rules = rules_leaving_frozen_to_people(self.where / "rules")
            config = config.model_copy(update={"rules": [str(rules)]})
        app = assemble(config, state=self.where / "state", clock=time.time, sleep=time.sleep,
                       seed=7)  # fmt: skip
        self.made.append(app)
        return app

    def close(self) -> None:
        for app in self.made:
            app.close()


def first_escalation(app: Any, kind: str, ticks: int = 500) -> dict[str, Any]:
    """Tick `app` until it has raised an escalation of `kind`: the first one."""
    for _ in range(ticks):
        app.controller.tick()
        found = [e for e in app.journal.escalations.recent() if e["kind"] == kind]
        if found:
            return found[0]
    raise AssertionError(f"no {kind} escalation in {ticks} ticks")


@dataclass(frozen=True)
class Claim:
    """What an instance's agent record says about it (its own word, as the fleet reads it)."""

    label: str
    stage: str
    bench_rate: float | None
    host_and_port: str | None
    vast_id: str = ""
    machine_id: str = ""


@contextmanager
def curio_schema(dsn: str) -> Iterator[Any]:
    """A Curio schema of its own in the test PostgreSQL (tests/fakes/curio_db.py), dropped
    afterwards; a clear failure when no server answers."""
    import psycopg
    from fakes.curio_db import CurioDB

    try:
        with psycopg.connect(dsn, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        pytest.fail(f"test PostgreSQL unreachable at {dsn!r} ({exc})", pytrace=False)
    with CurioDB(dsn) as curio:
        yield curio


# A rules file that asks people about a grown fleet: a `requested` escalation on demand.
ASKS = """\
# Questions for people: what the operators want to look at themselves.
rules:
  - name: ask-about-a-grown-fleet
    description: The fleet has grown; the operators look at it themselves.
    when:
      fleet: {instances: {gte: 2}}
    then: {action: escalate, reason: "the fleet has {{ fleet.instances }} instance(s)"}
    confidence: 0.9
"""


class StillFleet(AcceptingFleet):
    """A provider and demand sensor that hold still: no instances, an empty queue, no launch,
    every other action a no-op. A test's fleet overrides what it exercises."""

    def list_instances(self) -> list[Instance]:
        return []

    def demand(self) -> list[Demand]:
        return [Demand("all", 0, 0)]

    def launch(self, request: LaunchRequest) -> str:
        raise AssertionError("nothing is launched here")


def fail_fleet_reads(monkeypatch: pytest.MonkeyPatch, journal: Journal) -> Callable[[], None]:
    """Every tick's read of the fleet's history fails (a disk I/O error) until the returned
    function puts the read back: ticks that fail in a row."""
    history = journal.fleet.history

    def failing(*args: Any) -> Any:
        raise JournalError("journal (fleet): disk I/O error")

    monkeypatch.setattr(journal.fleet, "history", failing)
    return lambda: monkeypatch.setattr(journal.fleet, "history", history)
