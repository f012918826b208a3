"""The Curio demand sensor against a real PostgreSQL, one fresh schema per test.

The database comes from FLEETGATE_TEST_PG_DSN (default: the local trust-auth server). These tests
fail, never skip, when it is unreachable: a sensor tested against nothing is not tested.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from fakes.curio_db import CurioDB, SilentServer
from psycopg import sql
from pydantic import ValidationError

from controller.core.model import Demand
from controller.fleet.base import DemandSensor, SensorError, StaleReading
from controller.fleet.curio import (
    SERIALIZATION_ATTEMPTS,
    CurioDemand,
    CurioSettings,
    connect,
    summarize,
)

DSN = os.environ.get("FLEETGATE_TEST_PG_DSN", "host=127.0.0.1 port=5432 dbname=test user=postgres")
PASSWORD = "Pw-" + secrets.token_hex(8)


@pytest.fixture(scope="module")
def dsn() -> str:
    try:
        with psycopg.connect(DSN, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        pytest.fail(
            f"test PostgreSQL unreachable at {DSN!r} ({exc}); "
            "start it or point FLEETGATE_TEST_PG_DSN at one",
            pytrace=False,
        )
    return DSN


@pytest.fixture
def db(dsn: str) -> Iterator[CurioDB]:
    with CurioDB(dsn) as curio:
        yield curio


def sensor(db: CurioDB, dsn: str = DSN, **settings: Any) -> CurioDemand:
    return CurioDemand(CurioSettings(dsn=dsn, schema_name=db.schema, **settings))


def by_task(demand: list[Demand]) -> dict[str, Demand]:
    return {d.task: d for d in demand}


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- demand --------------------------------------------------------------------------------


def test_counts_pending_and_running_per_task_and_a_weighted_total(db: CurioDB) -> None:
    node = db.add_machine("10.0.0.1:12300")
    porep = db.post("PoRep", 3)
    db.post("WdPost", 3)
    db.claim(porep[:1], node)

    reading: DemandSensor = sensor(db, tasks={"PoRep": 2.0, "WdPost": 0.5, "WinPost": 1.0})
    got = reading.demand()

    assert [d.task for d in got] == ["PoRep", "WdPost", "WinPost", "all"]
    demand = by_task(got)
    assert (demand["PoRep"].pending, demand["PoRep"].running) == (2, 1)
    assert (demand["WdPost"].pending, demand["WdPost"].running) == (3, 0)
    assert demand["WinPost"] == Demand("WinPost", 0, 0, 0.0, 0)
    assert (demand["all"].pending, demand["all"].running) == (round(2 * 2 + 0.5 * 3), 2)


def test_a_light_task_never_vanishes_from_the_weighted_total(db: CurioDB) -> None:
    db.post("PoRep")

    assert by_task(sensor(db, tasks={"PoRep": 0.3}).demand())["all"].pending == 1

    db.post("PoRep", 2)
    assert by_task(sensor(db, tasks={"PoRep": 0.5}).demand())["all"].pending == 2  # 1.5 up
    # float noise does not round up: 0.1 x 3 + 1.1 x 7 sums to 8.000000000000002
    rows = [("PoRep", 3, 0, 0.0, 0), ("WdPost", 7, 0, 0.0, 0)]
    assert summarize({"PoRep": 0.1, "WdPost": 1.1}, rows)[-1].pending == 8


def test_default_tasks_are_the_gpu_proving_tasks_with_weight_one(db: CurioDB) -> None:
    for name in ("PoRep", "UpdateProve", "PSProve", "WdPost", "WinPost"):
        db.post(name, 2)

    demand = by_task(sensor(db).demand())

    assert set(demand) == {"PoRep", "UpdateProve", "PSProve", "WdPost", "WinPost", "all"}
    assert demand["all"].pending == 10


def test_an_empty_queue_reads_zeros_not_an_error(db: CurioDB) -> None:
    demand = by_task(sensor(db).demand())

    assert demand["all"] == Demand("all", 0, 0, 0.0, 0)


def test_a_queue_no_curio_node_has_touched_for_too_long_is_stale(db: CurioDB) -> None:
    first = db.add_machine("10.0.0.1:12300", last_contact_age_s=700)
    second = db.add_machine("10.0.0.2:12300", last_contact_age_s=650)
    db.post("PoRep", 3)
    with pytest.raises(StaleReading, match=r"none of its 2 node\(s\) has checked in for 65\d s"):
        sensor(db).demand()
    db.heartbeat(second, age_s=5)  # one node alive: the queue is being worked
    assert by_task(sensor(db).demand())["PoRep"].pending == 3
    db.heartbeat(second, age_s=120)
    with pytest.raises(StaleReading):
        sensor(db, heartbeat_stale_s=100.0).demand()
    db.remove_machine(first)
    db.remove_machine(second)  # no nodes at all: a new cluster, nothing to judge by
    assert by_task(sensor(db).demand())["PoRep"].pending == 3


def test_oldest_pending_age_is_measured_by_the_database_clock(db: CurioDB) -> None:
    node = db.add_machine("10.0.0.1:12300")
    db.post("PoRep", age_s=120)
    db.post("PoRep", age_s=10)
    db.post("WdPost", age_s=30)
    db.claim(db.post("PoRep", age_s=3600), node)  # running: not waiting any more

    demand = by_task(sensor(db).demand())

    assert 120 <= demand["PoRep"].oldest_pending_s < 130
    assert 30 <= demand["WdPost"].oldest_pending_s < 40
    assert demand["all"].oldest_pending_s == demand["PoRep"].oldest_pending_s
    assert demand["WinPost"].oldest_pending_s == 0.0


def test_a_task_given_back_to_the_queue_waits_since_then_not_since_it_was_posted(
    db: CurioDB,
) -> None:
    node = db.add_machine("10.0.0.1:12300")
    failed = db.post("PSProve", age_s=3600)  # waited, ran, failed: Curio retries it
    db.claim(failed, node)
    db.release(failed)
    (restarted,) = db.post("PoRep", age_s=7200)  # failed for good; a person restarts it
    db.claim([restarted], node)
    db.finish([restarted], result=False)
    db.restart(restarted, "PoRep", posted_age_s=7200)

    demand = by_task(sensor(db).demand())

    assert (demand["PSProve"].pending, demand["PoRep"].pending) == (1, 1)
    assert demand["PSProve"].oldest_pending_s < 60
    assert demand["PoRep"].oldest_pending_s < 60
    assert demand["all"].oldest_pending_s < 60


def test_max_retries_counts_pending_tasks_only(db: CurioDB) -> None:
    node = db.add_machine("10.0.0.1:12300")
    db.post("PoRep", retries=1)
    failed = db.post("UpdateProve", retries=2)
    db.claim(failed, node)
    db.release(failed)  # failed once more: back to pending with retries 3
    db.claim(db.post("WdPost", retries=9), node)  # running

    demand = by_task(sensor(db).demand())

    assert demand["PoRep"].max_retries == 1
    assert demand["UpdateProve"].max_retries == 3
    assert (demand["UpdateProve"].pending, demand["UpdateProve"].running) == (1, 0)
    assert demand["WdPost"].max_retries == 0
    assert demand["all"].max_retries == 3


def test_task_names_not_configured_are_ignored(db: CurioDB) -> None:
    db.post("SDR", 5, age_s=900, retries=4)
    db.post("TreeRC", 2)
    db.post("PoRep", 1, age_s=5)

    got = sensor(db, tasks={"PoRep": 1.0}).demand()

    assert [d.task for d in got] == ["PoRep", "all"]
    demand = by_task(got)
    assert demand["all"].pending == 1
    assert demand["all"].oldest_pending_s < 60
    assert demand["all"].max_retries == 0


def test_finishing_tasks_removes_them_and_writes_history(db: CurioDB) -> None:
    node = db.add_machine("10.0.0.1:12300")
    tasks = db.post("PSProve", 4)
    db.claim(tasks, node)
    reader = sensor(db)
    assert by_task(reader.demand())["PSProve"].running == 4

    db.finish(tasks[:3])

    demand = by_task(reader.demand())
    assert (demand["PSProve"].pending, demand["PSProve"].running) == (0, 1)
    assert db.count("harmony_task_history") == 3


def test_a_deleted_machine_gives_its_tasks_back_to_the_queue(db: CurioDB) -> None:
    node = db.add_machine("10.0.0.1:12300", last_contact_age_s=700)
    db.claim(db.post("PoRep", 2, age_s=900), node)

    db.remove_machine(node)  # what Curio does to a node silent for ~10 minutes

    demand = by_task(sensor(db).demand())
    assert (demand["PoRep"].pending, demand["PoRep"].running) == (2, 0)
    # ON DELETE SET NULL touches neither time: they have waited since they were posted
    assert 900 <= demand["PoRep"].oldest_pending_s < 960


def test_schema_names_are_quoted_as_identifiers(dsn: str) -> None:
    odd = f'Curio "{secrets.token_hex(3)}"; DROP TABLE x; --'
    with CurioDB(dsn, schema=odd) as db:
        db.post("PoRep", 2)

        assert by_task(sensor(db).demand())["PoRep"].pending == 2


def test_each_call_uses_its_own_connection_closed_after_a_read_only_transaction(
    db: CurioDB,
) -> None:
    opened: list[psycopg.Connection[Any]] = []

    def recording(settings: CurioSettings) -> psycopg.Connection[Any]:
        opened.append(connect(settings))
        return opened[-1]

    reader = CurioDemand(CurioSettings(dsn=DSN, schema_name=db.schema), connect=recording)
    reader.demand()
    reader.machines()

    assert len(opened) == 2
    assert all(c.closed and c.read_only for c in opened)


# --- machines and drain ----------------------------------------------------------------------


def test_machines_report_heartbeat_age_cordon_and_running_tasks(db: CurioDB) -> None:
    busy = db.add_machine("10.0.0.1:12300", last_contact_age_s=30)
    silent = db.add_machine("10.0.0.2:12300", last_contact_age_s=900, unschedulable=True)
    db.claim(db.post("PoRep", 2) + db.post("SDR", 1), busy)
    db.post("PoRep", 1)  # pending: nobody's

    machines = sensor(db).machines()

    assert [m.id for m in machines] == [busy, silent]
    first, second = machines
    assert (first.host_and_port, first.unschedulable, first.running_tasks) == (
        "10.0.0.1:12300", False, 3,
    )  # fmt: skip
    assert 30 <= first.last_contact_age_s < 40 and not first.stale
    assert (second.unschedulable, second.running_tasks, second.stale) == (True, 0, True)
    assert 900 <= second.last_contact_age_s < 910

    db.heartbeat(silent)
    assert sensor(db).machines()[1].last_contact_age_s < 10


def test_drain_and_undrain_by_id_and_by_host_and_port(db: CurioDB) -> None:
    node = db.add_machine("10.0.0.1:12300")
    other = db.add_machine("10.0.0.2:12300")
    curio = sensor(db, allow_drain=True)

    assert curio.drain(node) == 1
    assert db.machine(node)["unschedulable"] is True
    assert db.machine(other)["unschedulable"] is False
    assert curio.drain(str(node)) == 1  # draining twice is fine

    assert curio.undrain("10.0.0.1:12300") == 1
    assert db.machine(node)["unschedulable"] is False
    assert curio.drain("10.0.0.2:12300") == 1
    assert [m.unschedulable for m in curio.machines()] == [False, True]


def test_an_address_two_machines_announce_is_neither_drained_nor_undrained(db: CurioDB) -> None:
    """Instances on one host share its public address; a second row with the same
    host_and_port (the operator's node, cordoned) was undrained and drained with ours."""
    ours = db.add_machine("10.0.0.1:12300")
    theirs = db.add_machine("10.0.0.1:12300", unschedulable=True)
    curio = sensor(db, allow_drain=True)
    for verb in (curio.undrain, curio.drain):
        with pytest.raises(SensorError, match=r"refused: 2 machines have host_and_port "
                           r"'10.0.0.1:12300', and only one is the instance's"):  # fmt: skip
            verb("10.0.0.1:12300")
    assert (db.machine(ours)["unschedulable"], db.machine(theirs)["unschedulable"]) == (False, True)
    assert curio.drain(ours) == 1  # by id, one row


def test_drain_is_refused_unless_the_config_allows_it(db: CurioDB) -> None:
    node = db.add_machine("10.0.0.1:12300")

    with pytest.raises(SensorError, match="draining is not allowed by the config"):
        sensor(db).drain(node)
    with pytest.raises(SensorError, match="draining is not allowed by the config"):
        sensor(db).undrain(node)
    assert db.machine(node)["unschedulable"] is False


@pytest.mark.parametrize("machine", [424242, "10.9.9.9:12300"])
def test_draining_an_unknown_machine_is_an_error(db: CurioDB, machine: int | str) -> None:
    db.add_machine("10.0.0.1:12300")

    with pytest.raises(SensorError, match=r"no Curio machine with (id|host_and_port)"):
        sensor(db, allow_drain=True).drain(machine)


# --- failures ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad_dsn",
    [
        f"host=127.0.0.1 port={closed_port()} dbname=test user=postgres password={PASSWORD}",
        f"postgresql://postgres:{PASSWORD}@127.0.0.1:{closed_port()}/test",
        f"host=127.0.0.1 port=5432 dbname=test user=nobody_{secrets.token_hex(3)} "
        f"password={PASSWORD}",
        f"host=127.0.0.1 dbname=no_such_db_{secrets.token_hex(3)} user=postgres "
        f"password={PASSWORD}",
        f"postgresql://postgres:{PASSWORD}@127.0.0.1:5432/test?sslmode=nonsense",
        f"host=127.0.0.1 password={PASSWORD} 'unterminated",
        f"host=127.0.0.1 dbname=test password=Pw {PASSWORD[3:]}",  # an unquoted space
    ],
    ids=[
        "refused",
        "refused-uri",
        "no-such-role",
        "no-such-db",
        "bad-option",
        "unparsable",
        "unparsable-password",
    ],  # fmt: skip
)
def test_a_failed_connection_is_a_sensor_error_without_the_password(
    db: CurioDB, bad_dsn: str
) -> None:
    started = time.monotonic()

    with pytest.raises(SensorError) as caught:
        sensor(db, dsn=bad_dsn).demand()

    assert time.monotonic() - started < 2
    message = str(caught.value)
    assert message.startswith("cannot connect to the Curio database")
    assert message.endswith("(check curio.dsn, and that the server runs)")  # where to look
    assert PASSWORD not in message and PASSWORD[3:] not in message and bad_dsn not in message


def test_a_server_gone_silent_mid_query_is_dropped_by_keepalives() -> None:
    """The statement timeout is enforced by the server: one that stops answering (a partition,
    a host powered off) never sends it, and the demand read waited for ever, and the tick with
    it (the system's own keepalive starts after two hours)."""
    conn = connect(CurioSettings(dsn=DSN))
    with conn, socket.socket(fileno=os.dup(conn.fileno())) as sock:
        idle = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE)
        interval = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL)
        count = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT)
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert idle + interval * count <= 60


def test_a_hung_server_times_out_at_connect_timeout(db: CurioDB) -> None:
    with SilentServer() as silent:
        hung = f"host=127.0.0.1 port={silent.port} dbname=test user=postgres password={PASSWORD}"
        started = time.monotonic()

        with pytest.raises(SensorError, match="cannot connect") as caught:
            sensor(db, dsn=hung, connect_timeout_s=2).demand()

    assert 1.5 <= time.monotonic() - started < 5
    assert PASSWORD not in str(caught.value)


def test_a_connect_error_echoing_the_password_is_scrubbed(db: CurioDB) -> None:
    def leaky(settings: CurioSettings) -> psycopg.Connection[Any]:
        raise psycopg.OperationalError(f"boom in {settings.dsn.get_secret_value()}")

    settings = CurioSettings(dsn=f"host=127.0.0.1 user=postgres password={PASSWORD}")

    with pytest.raises(SensorError) as caught:
        CurioDemand(settings, connect=leaky).demand()

    assert PASSWORD not in str(caught.value)
    assert "127.0.0.1" in str(caught.value)


def test_a_missing_schema_is_a_sensor_error(db: CurioDB) -> None:
    curio = CurioDemand(CurioSettings(dsn=DSN, schema_name=f"nope_{secrets.token_hex(4)}"))

    with pytest.raises(SensorError, match="is curio.schema_name 'nope_.*' right"):
        curio.demand()
    with pytest.raises(SensorError, match="harmony_machines"):
        curio.machines()


def test_a_missing_table_is_a_sensor_error(db: CurioDB) -> None:
    db.conn.execute(
        sql.SQL("DROP TABLE {}.harmony_task").format(sql.Identifier(db.schema)),
    )

    with pytest.raises(SensorError, match=r"Curio demand query failed: .*harmony_task"):
        sensor(db).demand()


# What YugabyteDB answers when it cannot serialize a statement (a read restart, a write racing
# another on the same row): SQLSTATE 40001, raised here by the server itself
RESTART_READ = (
    "DO $$ BEGIN RAISE EXCEPTION 'Restart read required' USING ERRCODE = 'serialization_failure';"
    " END $$"
)


class Conflicted:
    """A `Connect` to the test database whose first `conflicts` transactions fail with 40001 at
    their first statement after the statement timeout, as a busy YugabyteDB's may."""

    def __init__(self, conflicts: int) -> None:
        self.conflicts = conflicts
        self.opened = 0

    def __call__(self, settings: CurioSettings) -> psycopg.Connection[Any]:
        conn = connect(settings)
        self.opened += 1
        if self.conflicts > 0:
            self.conflicts -= 1
            conn.cursor_factory = _ConflictingCursor
        return conn


class _ConflictingCursor(psycopg.Cursor[Any]):
    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        if isinstance(query, sql.Composable):  # the sensor's own statements (not set_config)
            query, params = RESTART_READ, None
        return super().execute(query, params, **kwargs)


def test_a_transaction_the_database_could_not_serialize_runs_again(db: CurioDB) -> None:
    node = db.add_machine("10.0.0.1:12300")
    db.claim(db.post("PoRep", 2), node)
    db.post("PoRep", 3)
    settings = CurioSettings(dsn=DSN, schema_name=db.schema, allow_drain=True)

    conflicted = Conflicted(1)
    demand = by_task(CurioDemand(settings, connect=conflicted).demand())
    assert (demand["PoRep"].pending, demand["PoRep"].running) == (3, 2)
    assert conflicted.opened == 2

    conflicted = Conflicted(SERIALIZATION_ATTEMPTS - 1)
    assert CurioDemand(settings, connect=conflicted).drain("10.0.0.1:12300") == 1
    assert db.machine(node)["unschedulable"] is True
    assert conflicted.opened == SERIALIZATION_ATTEMPTS

    conflicted = Conflicted(1)
    assert [m.id for m in CurioDemand(settings, connect=conflicted).machines()] == [node]
    assert conflicted.opened == 2


def test_a_transaction_that_never_serializes_is_a_sensor_error(db: CurioDB) -> None:
    db.add_machine("10.0.0.1:12300")
    settings = CurioSettings(dsn=DSN, schema_name=db.schema, allow_drain=True)
    conflicted = Conflicted(SERIALIZATION_ATTEMPTS)

    with pytest.raises(SensorError, match="undrain .*SerializationFailure: Restart read required"):
        CurioDemand(settings, connect=conflicted).undrain("10.0.0.1:12300")
    assert conflicted.opened == SERIALIZATION_ATTEMPTS

    db.conn.execute(sql.SQL("DROP TABLE {}.harmony_task").format(sql.Identifier(db.schema)))
    conflicted = Conflicted(0)
    with pytest.raises(SensorError, match="harmony_task"):
        CurioDemand(settings, connect=conflicted).demand()
    assert conflicted.opened == 1  # any other failure is not run again


def test_a_locked_table_times_out_at_the_statement_timeout(db: CurioDB) -> None:
    db.post("PoRep")
    curio = sensor(db, statement_timeout_ms=200, allow_drain=True)
    node = db.add_machine("10.0.0.1:12300")

    with db.locked("harmony_task"):
        started = time.monotonic()
        with pytest.raises(SensorError, match="timed out after statement_timeout_ms=200"):
            curio.demand()
        assert time.monotonic() - started < 3
    with db.locked("harmony_machines"), pytest.raises(SensorError, match="drain .* timed out"):
        curio.drain(node)

    assert by_task(curio.demand())["PoRep"].pending == 1  # the timeout was per transaction


# --- settings ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"surprise": 1}, "Extra inputs are not permitted"),
        ({"tasks": {}}, "at least one Curio task"),
        ({"tasks": {"all": 1.0}}, "'all' is reserved"),
        ({"tasks": {"ProveThisVeryLongName": 1.0}}, "1-16 characters"),
        ({"tasks": {"PoRep": 0.0}}, "weight must be a positive number"),
        ({"schema_name": ""}, "at least 1 character"),
        ({"statement_timeout_ms": "5000"}, "valid integer"),
        ({"connect_timeout_s": 1}, "greater than or equal to 2"),
    ],
)
def test_bad_settings_are_rejected(fields: dict[str, Any], expected: str) -> None:
    with pytest.raises(ValidationError, match=expected):
        CurioSettings(dsn="host=x", **fields)


def test_settings_never_show_the_dsn() -> None:
    settings = CurioSettings(dsn=f"postgresql://yugabyte:{PASSWORD}@db:5433/yugabyte")

    assert PASSWORD not in repr(settings) and PASSWORD not in str(settings)
    assert settings.tasks == dict.fromkeys(
        ("PoRep", "UpdateProve", "PSProve", "WdPost", "WinPost"), 1.0
    )
