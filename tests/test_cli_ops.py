"""Daily operation through the `fleetgate` command: the journal-only commands while rules or
secrets are broken, the options, the logs, closed pipes, unwritable state, SIGHUP, the
shipped systemd unit (real processes on the built-in simulator)."""

from __future__ import annotations

import configparser
import json
import logging
import os
import re
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from controller.store.journal import Journal

ROOT = Path(__file__).resolve().parent.parent
MAIN = "import sys; from controller.service.cli import main; sys.exit(main())"
UNSET = "FLEETGATE_TEST_NEVER_SET_URL"


def fg(
    *args: str, cwd: Path = ROOT, env: dict[str, str] | None = None, **kw: Any
) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in (UNSET, "FLEETGATE_STATE")}
    environ["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-c", MAIN, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**environ, **(env or {})},
        **kw,
    )


def ok(out: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert out.returncode == 0, (
        f"exit {out.returncode}:\n{out.stdout[-1500:]}\n{out.stderr[-3000:]}"
    )
    return out


@pytest.fixture(scope="module")
def journal_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A state directory after two ticks, with one pending escalation."""
    state = tmp_path_factory.mktemp("ops") / "state"
    for _ in range(2):
        ok(fg("--state", str(state), "tick"))
    j = Journal(state / "journal.db")
    try:
        j.escalations.add_escalation(
            fingerprint="fp-ops",
            kind="unmatched",
            subject="instance:10004",
            summary="status 'odd' matches no rule",
            now=1.0e9,
            deadline=2.0e9,
            situation={"instance": {"id": "10004"}},
            default_action={"action": "hold", "params": {}},
        )
    finally:
        j.close()
    return state


def broken_rules(tmp: Path) -> Path:
    rules = tmp / "rules"
    rules.mkdir()
    for f in (ROOT / "rules").glob("*.yaml"):
        shutil.copy(f, rules / f.name)
    (rules / "zz-broken.yaml").write_text(
        "rules:\n  - name: typo\n    when: {instance: {restarts_1h: {greater: 3}}}\n"
        "    then: {action: hold}\n    confidence: 0.9\n"
    )
    return rules


def config(tmp: Path, text: str) -> Path:
    cfg = tmp / "fleetgate.yaml"
    cfg.write_text(text)
    return cfg


@pytest.fixture(params=["broken rules", "unset secret", "typo"])
def broken(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, str]:
    """A config `run` refuses, and the words its warning must contain. (A typo in a live
    config made `pause`, the brake, and `status` refuse too, while the controller went on
    with the config it had loaded.)"""
    if request.param == "broken rules":
        rules = broken_rules(tmp_path)
        return config(tmp_path, f"rules: ['{rules}']\n"), "zz-broken.yaml:3"
    if request.param == "typo":
        text = "guards:\n  max_instancs: 4\nescalation:\n  deadline_s: -5\n"
        return config(tmp_path, text), "fleetgate.yaml:2: guards.max_instancs: unknown key"
    slack = f"{{type: slack, webhook_url: {{env: {UNSET}}}}}"
    text = f"escalation:\n  channels:\n    - console\n    - {slack}\n"
    return config(tmp_path, text), f"environment variable {UNSET} is not set"


def test_run_and_tick_refuse_the_broken_configs(
    broken: tuple[Path, str], journal_dir: Path
) -> None:
    cfg, words = broken
    out = fg("--config", str(cfg), "--state", str(journal_dir), "explain")
    assert out.returncode == 2 and words.split(":")[0] in out.stderr


@pytest.mark.parametrize(
    "command",
    [
        ["status"],
        ["status", "--json"],
        ["actions"],
        ["actions", "--json", "--all"],
        ["escalations", "list"],
        ["escalations", "show", "1"],
        ["escalations", "show", "1", "--json"],
    ],
)
def test_read_commands_work_with_broken_rules_or_an_unset_secret(
    broken: tuple[Path, str], journal_dir: Path, command: list[str]
) -> None:
    cfg, words = broken
    out = ok(fg("--config", str(cfg), "--state", str(journal_dir), *command))
    warnings = [line for line in out.stderr.splitlines() if line.startswith("fleetgate: warning")]
    assert len(warnings) == 1 and words in warnings[0], out.stderr
    assert "Traceback" not in out.stderr and out.stdout.strip()


def test_read_commands_read_the_rules_with_the_configs_settings(
    tmp_path: Path, journal_dir: Path
) -> None:
    # rules whose parameter reads a setting only the config sets load for `run`: `status`
    # must not warn that `run` refuses them
    rules = tmp_path / "rules"
    shutil.copytree(ROOT / "rules", rules, ignore=shutil.ignore_patterns("tests"))
    (rules / "zz-tell.yaml").write_text(
        "rules:\n  - name: tell\n    when: {demand: {pending: {gt: 0}}}\n"
        "    then: {action: notify, message: 'over {{ settings.queue_alarm }}'}\n"
        "    confidence: 0.9\n"
    )
    with_it = config(tmp_path, f"rules: ['{rules}']\nsettings: {{queue_alarm: 50}}\n")
    out = ok(fg("--config", str(with_it), "--state", str(journal_dir), "status"))
    assert "warning" not in out.stderr, out.stderr
    without = tmp_path / "bare.yaml"
    without.write_text(f"rules: ['{rules}']\n")
    out = ok(fg("--config", str(without), "--state", str(journal_dir), "status"))
    assert "zz-tell.yaml:4: rule 'tell': parameter 'message': unknown setting 'queue_alarm'" in (
        out.stderr
    ), out.stderr


def test_pause_and_resume_work_with_broken_rules_or_an_unset_secret(
    broken: tuple[Path, str], tmp_path: Path, journal_dir: Path
) -> None:
    cfg, words = broken
    state = tmp_path / "copy"
    shutil.copytree(journal_dir, state)
    out = ok(fg("--config", str(cfg), "--state", str(state), "pause"))
    assert out.stdout.startswith("paused") and words in out.stderr
    st = json.loads(ok(fg("--config", str(cfg), "--state", str(state), "status", "--json")).stdout)
    assert st["paused"] is True
    ok(fg("--state", str(state), "resume", "--config", str(cfg)))
    db = sqlite3.connect(state / "journal.db")
    assert db.execute("SELECT value FROM kv WHERE key = 'paused'").fetchone()[0] == "false"


@pytest.mark.parametrize(
    ("answer", "done"),
    [(["approve", "1", "--action", "hold"], "approved"), (["deny", "1"], "denied")],
)
def test_answers_work_with_a_secret_only_run_uses_unset(
    journal_dir: Path, tmp_path: Path, answer: list[str], done: str
) -> None:
    """The unit's commands run as its user, without the root-only environment file: an answer is
    journaled for the running controller (it sends nothing), so the unset secret is a warning."""
    state = tmp_path / "copy"
    shutil.copytree(journal_dir, state)
    slack = f"{{type: slack, webhook_url: {{env: {UNSET}}}}}"
    cfg = config(tmp_path, f"escalation:\n  channels:\n    - console\n    - {slack}\n")
    out = ok(fg("--config", str(cfg), "--state", str(state), "escalations", *answer, "--by", "ops"))
    assert out.stdout.startswith(f"escalation #1 {done} by ops")
    warnings = [line for line in out.stderr.splitlines() if line.startswith("fleetgate: warning")]
    assert len(warnings) == 1 and f"environment variable {UNSET} is not set" in warnings[0]
    row = sqlite3.connect(state / "journal.db").execute(
        "SELECT status, answered_by FROM escalations WHERE id = 1"
    )
    assert row.fetchone() == (done, "ops")


@pytest.mark.parametrize(
    "command",
    [
        ["status"],
        ["actions"],
        ["escalations", "list"],
        ["escalations", "show", "1"],
        ["escalations", "approve", "1"],
        ["escalations", "deny", "1"],
        ["pause"],
        ["resume"],
    ],
)
def test_journal_commands_never_create_a_journal(tmp_path: Path, command: list[str]) -> None:
    out = fg(*command, cwd=tmp_path)
    assert out.returncode == 1
    assert (
        out.stderr.strip()
        == "fleetgate: no journal at .fleetgate/journal.db (see --state, --config)"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "command", [["status"], ["escalations", "list"], ["pause"], ["escalations", "deny", "1"]]
)
def test_journal_commands_never_create_a_postgresql_journal(
    tmp_path: Path, command: list[str]
) -> None:
    """They created the schema and its tables, and printed an empty status."""
    import secrets

    import psycopg
    from support import PG_DSN

    schema = f"fg_none_{secrets.token_hex(6)}"
    cfg = tmp_path / "pg.yaml"
    cfg.write_text(f"journal: {{dsn: {{env: FG_TEST_DSN}}, schema_name: {schema}}}\n")
    out = fg("--config", str(cfg), *command, cwd=tmp_path, env={"FG_TEST_DSN": PG_DSN})
    assert out.returncode == 1, out.stderr
    info = psycopg.conninfo.conninfo_to_dict(PG_DSN)
    where = f"postgresql {info.get('host')}:{info.get('port')}/{info.get('dbname')}"
    assert out.stderr.strip() == f"fleetgate: no journal in {where} schema {schema} (see --config)"
    with psycopg.connect(PG_DSN) as conn:
        found = conn.execute("SELECT 1 FROM information_schema.schemata WHERE schema_name = %s",
                             (schema,)).fetchone()  # fmt: skip
    assert found is None


def test_common_options_go_before_or_after_the_command(journal_dir: Path, tmp_path: Path) -> None:
    cfg = config(tmp_path, "guards: {paused: true}\n")
    before = json.loads(
        ok(fg("--config", str(cfg), "--state", str(journal_dir), "status", "--json")).stdout
    )
    after = json.loads(
        ok(
            fg(
                "status",
                "--json",
                "--config",
                str(cfg),
                "--state",
                str(journal_dir),
                "--log-level",
                "ERROR",
            )
        ).stdout
    )
    before.pop("leader"), after.pop("leader")  # its time left differs
    assert before == after and after["paused"] is True and after["last_tick"]["id"] == 2
    nested = ok(fg("escalations", "list", "--json", "--state", str(journal_dir)))
    assert [e["id"] for e in json.loads(nested.stdout)] == [1]


def test_version_and_escalations_help() -> None:
    out = ok(fg("--version"))
    assert out.stdout.strip() == "fleetgate 0.1.0"
    helped = ok(fg("escalations", "--help")).stdout
    for sub in ("list", "show", "approve", "deny"):
        assert f"\n    {sub} " in helped, helped


def test_show_is_text_unless_json(journal_dir: Path) -> None:
    text = ok(fg("--state", str(journal_dir), "escalations", "show", "1")).stdout
    assert text.startswith("escalation #1 pending: unmatched instance:10004")
    doc = json.loads(
        ok(fg("--state", str(journal_dir), "escalations", "show", "1", "--json")).stdout
    )
    assert doc["situation"] == {"instance": {"id": "10004"}} and doc["outbox"] == []


def test_a_bare_param_value_is_the_text_the_action_expects(
    journal_dir: Path, tmp_path: Path
) -> None:
    state = tmp_path / "s"
    shutil.copytree(journal_dir, state)
    bad = fg(
        "--state",
        str(state),
        "escalations",
        "approve",
        "1",
        "--action",
        "launch",
        "--param",
        "count=many",
    )
    assert bad.returncode == 2 and "count" in bad.stderr and "Traceback" not in bad.stderr
    out = ok(
        fg(
            "--state",
            str(state),
            "escalations",
            "approve",
            "1",
            "--by",
            "ops",
            "--action",
            "drain",
            "--param",
            "instance=10004",
        )
    )
    assert "drain instance=10004" in out.stdout
    answer = json.loads(
        sqlite3.connect(state / "journal.db")
        .execute("SELECT answer FROM escalations WHERE id = 1")
        .fetchone()[0]
    )
    assert answer["params"] == {"instance": "10004"}


def test_a_cron_tick_at_warning_prints_nothing(tmp_path: Path) -> None:
    out = ok(fg("--state", str(tmp_path / "s"), "--log-level", "WARNING", "tick"))
    assert out.stderr == "" and out.stdout == ""
    info = ok(fg("--state", str(tmp_path / "s"), "tick"))
    assert "leading as" in info.stderr and " INFO " in info.stderr.split("leading as")[0][-20:]


def test_json_logs_are_structured(tmp_path: Path) -> None:
    out = ok(fg("--state", str(tmp_path / "s"), "--log-format", "json", "tick"))
    docs = [json.loads(line) for line in out.stderr.splitlines()]
    assert docs and all({"ts", "level", "logger", "msg"} <= set(d) for d in docs)
    lead = next(d for d in docs if d["msg"].startswith("leading as"))
    assert lead["level"] == "INFO" and lead["logger"] == "controller.store.lease"
    assert lead["ts"].endswith("+00:00")
    from controller.service.cli import JsonFormatter

    record = logging.LogRecord("fleetgate.x", logging.INFO, __file__, 1, "pruned %d", (3,), None)
    record.deleted = {"ticks": 3}
    assert json.loads(JsonFormatter().format(record))["deleted"] == {"ticks": 3}


def test_a_closed_pipe_ends_quietly(journal_dir: Path) -> None:
    read, write = os.pipe()
    os.close(read)  # `| head` that has already gone
    try:
        proc = subprocess.run(
            [sys.executable, "-c", MAIN, "--state", str(journal_dir), "actions", "--all"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
    finally:
        os.close(write)
    assert proc.returncode == 141 and proc.stderr == ""


def test_an_unwritable_state_directory_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = fg("--state", str(blocker / "state"), "tick")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"fleetgate: state directory '{blocker / 'state'}' is not writable: Not a directory"
    ]


def test_a_state_directory_on_a_read_only_file_system_says_so(tmp_path: Path) -> None:
    """Under the unit's ProtectSystem=strict a --state outside StateDirectory= is read-only:
    the line said "Permission denied", and no chmod or chown makes it writable."""
    place = tmp_path / "ro"
    place.mkdir()
    mount = f"mount -t tmpfs -o ro tmpfs {shlex.quote(str(place))}"
    if subprocess.run(["unshare", "-m", "sh", "-c", mount], capture_output=True,
                      timeout=60).returncode != 0:  # fmt: skip
        pytest.skip("mounting needs a mount namespace of one's own (root)")
    command = [sys.executable, "-c", MAIN, "--state", str(place / "state"), "tick"]
    script = f"{mount} && exec {shlex.join(command)}"
    out = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert out.returncode == 2 and out.stdout == "", out.stderr
    assert out.stderr.strip().splitlines() == [
        f"fleetgate: state directory '{place / 'state'}' is not writable: Read-only file "
        "system (under systemd's ProtectSystem=strict only ReadWritePaths= and "
        "StateDirectory= are writable)"
    ]


@pytest.mark.parametrize("command", [["tick"], ["run", "--ticks", "1"]])
def test_a_state_directory_the_system_refuses_to_create_is_one_line(command: list[str]) -> None:
    """/proc is writable by its permission bits and refuses every new directory: only trying
    shows it (a traceback before)."""
    out = fg("--state", "/proc/fleetgate-state", *command)
    assert out.returncode == 2, out.stderr
    [line] = out.stderr.strip().splitlines()  # the reason: the system's (root or not)
    assert line.startswith("fleetgate: state directory '/proc/fleetgate-state' is not writable: ")


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["escalations", "approve", "99999999999999999999"],  # an OverflowError traceback
         "argument id: 99999999999999999999 is not between 1 and 9223372036854775807"),
        (["escalations", "show", "9223372036854775808"],
         "argument id: 9223372036854775808 is not between 1 and 9223372036854775807"),
        (["escalations", "deny", "0"], "argument id: 0 is not between 1 and 9223372036854775807"),
        (["escalations", "show", "x"], "argument id: not a whole number: 'x'"),
        (["actions", "--limit", "1e30"], "argument --limit: not a whole number: '1e30'"),
        (["run", "--ticks", "-1"], "argument --ticks: -1 is not between 0 and 9223372036854775807"),
    ],
)  # fmt: skip
def test_an_id_or_count_out_of_range_is_a_usage_error(
    args: list[str], error: str, tmp_path: Path
) -> None:
    out = fg("--state", str(tmp_path / "s"), *args)
    assert out.returncode == 2 and out.stderr.strip().endswith(error), out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "s").exists()


def test_the_rules_digest_does_not_depend_on_how_the_path_is_spelt(tmp_path: Path) -> None:
    digests = set()
    for spelling in (
        "rules",
        "./rules/",
        str(ROOT / "rules"),
        "controller/../rules",
        str(ROOT / "controller" / "shipped_rules"),
    ):
        out = ok(fg("check", spelling))
        digests.add(out.stdout.split("digest ")[1].split(";")[0])
    copy = tmp_path / "elsewhere"
    shutil.copytree(ROOT / "rules", copy)
    digests.add(ok(fg("check", str(copy))).stdout.split("digest ")[1].split(";")[0])
    assert len(digests) == 1, digests


def _wait_for(path: Path, sql: str, timeout: float = 60) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists():
            try:
                row = sqlite3.connect(path).execute(sql).fetchone()
                if row and row[0]:
                    return row[0]
            except sqlite3.OperationalError:
                pass
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {sql}")


def test_sighup_applies_settings_and_gate_and_journals_what_needs_a_restart(tmp_path: Path) -> None:
    cfg = config(tmp_path, "interval_s: 0.05\nsettings: {tasks_per_instance: 2}\n")
    state = tmp_path / "s"
    environ = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-c", MAIN, "--config", str(cfg), "--state", str(state), "run"],
        cwd=ROOT,
        env=environ,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        db = state / "journal.db"
        _wait_for(db, "SELECT COUNT(*) FROM ticks WHERE finished_at IS NOT NULL")
        cfg.write_text(
            "interval_s: 0.05\nsettings: {tasks_per_instance: 3}\n"
            "gate: {mode: propose}\nguards: {max_instances: 5}\n"
        )
        proc.send_signal(signal.SIGHUP)
        doc = json.loads(_wait_for(db, "SELECT value FROM kv WHERE key = 'config.reload'"))
        assert doc["applied"] == ["gate", "settings"], doc
        assert doc["restart_needed"] == ["guards"]
        cfg.write_text("interval_s: 0.05\nnot_a_key: 1\n")
        proc.send_signal(signal.SIGHUP)
        end = time.monotonic() + 60
        while "error" not in doc and time.monotonic() < end:
            row = sqlite3.connect(db).execute("SELECT value FROM kv WHERE key = 'config.reload'")
            doc = json.loads(row.fetchone()[0])
            time.sleep(0.1)
        assert "not_a_key" in doc["error"]
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]
    assert "SIGHUP: config" in err and "guards changed; restart fleetgate" in err


def test_the_shipped_systemd_unit(tmp_path: Path) -> None:
    unit = ROOT / "deploy" / "fleetgate.service"
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(unit)
    service = parser["Service"]
    assert service["ExecStart"].split()[1:] == [
        "--config",
        "/etc/fleetgate/config.yaml",
        "--state",
        "${STATE_DIRECTORY}",
        "--log-format",
        "json",
        "run",
    ]
    assert service["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert service["Restart"] == "on-failure" and service["StateDirectory"] == "fleetgate"
    assert service["ProtectSystem"] == "strict" and service["NoNewPrivileges"] == "yes"
    assert service.get("User") == "fleetgate" or service.get("DynamicUser") == "yes"
    verify = shutil.which("systemd-analyze")
    if verify is None:
        return
    exe = shutil.which("fleetgate") or str(Path(sys.executable).with_name("fleetgate"))
    local = tmp_path / "fleetgate.service"
    local.write_text(unit.read_text().replace("/opt/fleetgate/bin/fleetgate", exe))
    out = subprocess.run([verify, "verify", str(local)], capture_output=True, text=True, timeout=60)
    problems = [line for line in out.stderr.splitlines() if str(local) in line]
    assert out.returncode == 0 and not problems, out.stderr


def test_the_units_install_steps_give_the_example_config_what_it_names(tmp_path: Path) -> None:
    """The header of deploy/fleetgate.service, pasted: its `fleetgate init` and `cp` steps
    (the install's paths moved under tmp_path, the installed package being this tree) leave
    /etc/fleetgate/config.yaml the real fleet's example, with the rules folder it names; the
    unit's ExecStart then starts on it (`check` in place of `run`: it builds the same, dry).
    Before, no step made /etc/fleetgate/rules, and the service refused to start."""
    exe = Path(sys.executable).with_name("fleetgate")
    site = "/opt/fleetgate/lib/python3.11/site-packages/controller"
    places = {"/etc/fleetgate": str(tmp_path / "etc"), site: str(ROOT / "controller"),
              "/opt/fleetgate/bin/fleetgate": str(exe)}  # fmt: skip
    lines = []
    for line in (ROOT / "deploy" / "fleetgate.service").read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[1:].strip().removeprefix("install:").strip())
    pasted = []
    for n, line in enumerate(lines):
        if line.startswith(("/opt/fleetgate/bin/fleetgate init ", "cp ", "install -m 0644 ")):
            pasted.append(line + ("\n" + lines[n + 1] if line.endswith("\\") else ""))
    assert len(pasted) == 3, pasted
    places["/etc/systemd/system/"] = str(tmp_path / "systemd") + "/"
    (tmp_path / "systemd").mkdir()
    (tmp_path / "etc").mkdir()
    for step in pasted:
        for path, place in places.items():
            step = step.replace(path, place)
        out = subprocess.run(["sh", "-c", step], capture_output=True, text=True, timeout=120,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
        assert out.returncode == 0, f"{step}\n{out.stdout}{out.stderr}"
    # the unit, from the installed package (a wheel installs controller/deploy/)
    unit = (tmp_path / "systemd" / "fleetgate.service").read_bytes()
    assert unit == (ROOT / "deploy" / "fleetgate.service").read_bytes()
    cfg = tmp_path / "etc" / "config.yaml"
    cfg.write_text(cfg.read_text().replace("/etc/fleetgate", str(tmp_path / "etc")))
    secrets = {
        "VAST_API_KEY": "k" * 16,
        "CURIO_DSN": "host=127.0.0.1 dbname=curio",
        "FLEETGATE_API_TOKEN": "t" * 16,
        "SLACK_WEBHOOK_URL": "https://hooks.invalid/x",
    }
    out = fg("--config", str(cfg), "--state", str(tmp_path / "var"), "check", env=secrets)
    shipped = sum(
        t.count("\n  - name: ") for t in (f.read_text() for f in (ROOT / "rules").glob("*.yaml"))
    )
    assert out.returncode == 0 and out.stdout.startswith(f"ok: {shipped} rules"), out.stderr
    (tmp_path / "etc" / "rules").rename(tmp_path / "etc" / "gone")  # as it was before the step
    out = fg("--config", str(cfg), "--state", str(tmp_path / "var"), "check", env=secrets)
    assert out.returncode == 1 and "`fleetgate init DIR` writes the shipped rules" in out.stderr


def test_the_cron_example_names_commands_that_exist() -> None:
    lines = [
        line
        for line in (ROOT / "deploy" / "fleetgate-tick.cron").read_text().splitlines()
        if line.strip() and not line.startswith("#") and "=" not in line.split()[0]
    ]
    assert len(lines) == 2
    for line in lines:
        command = line.split("/opt/fleetgate/bin/fleetgate ", 1)[1].split(" >", 1)[0].split()
        assert "--log-level" in command and command[-1] in ("tick", "prune")
        out = fg(*command[:-1], command[-1], "--help")
        assert out.returncode == 0, out.stderr


def test_the_cron_lines_run_as_printed_with_secrets_from_the_env_file(tmp_path: Path) -> None:
    """Each line of deploy/fleetgate-tick.cron through /bin/sh as cron runs it (its variables,
    a bare PATH), the install's paths moved under tmp_path, on a config that names a secret
    as {env: NAME}: the tick prints nothing, and the daily prune reads the secret too."""
    exe = Path(sys.executable).with_name("fleetgate")
    places = {"/etc/fleetgate": tmp_path / "etc", "/var/lib/fleetgate": tmp_path / "var",
              "/opt/fleetgate/bin/fleetgate": exe}  # fmt: skip
    text = (ROOT / "deploy" / "fleetgate-tick.cron").read_text()
    for path, place in places.items():
        text = text.replace(path, str(place))
    (tmp_path / "etc").mkdir()
    for line in text.splitlines():  # the header's steps that make the state directory
        if line.startswith("#   install -d ") and str(tmp_path / "var") in line:
            words = shlex.split(line[1:])
            for owner in ("-o", "-g"):  # the fleetgate user is not on this machine
                at = words.index(owner)
                del words[at : at + 2]
            subprocess.run(words, check=True, timeout=60)
    assert (tmp_path / "var").is_dir(), "the header does not say how to make the state directory"
    (tmp_path / "etc" / "config.yaml").write_text(
        "provider: sim\ndemand: sim\nescalation:\n  channels:\n    - console\n"
        "    - {type: slack, webhook_url: {env: FLEETGATE_TEST_SLACK_URL}}\n"
    )
    (tmp_path / "etc" / "env").write_text("FLEETGATE_TEST_SLACK_URL=http://127.0.0.1:9/hook\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    jobs = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        if "=" in line.split()[0]:
            name, value = line.split("=", 1)
            env[name] = value
            continue
        fields = line.split(None, 6)  # minute hour day month weekday user command
        assert fields[5] == "fleetgate", line
        jobs.append(fields[6])
    assert [job.split(" >", 1)[0].rsplit(None, 1)[-1] for job in jobs] == ["tick", "prune"]
    for job in jobs:
        out = subprocess.run([env["SHELL"], "-c", job], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=300)  # fmt: skip
        assert out.returncode == 0, f"{job}\n{out.stdout}{out.stderr}"
        if job.endswith(" tick"):
            assert out.stdout == out.stderr == ""  # a routine tick: cron mails nothing
            assert (tmp_path / "var" / "journal.db").is_file()
        else:  # a routine prune: its counts dropped, so cron mails nothing either
            assert out.stdout == out.stderr == "", out.stdout + out.stderr
            assert job.endswith("prune >/dev/null")


def _readme_command(marker: str) -> list[str]:
    text = (ROOT / "README.md").read_text()
    start = text.index(marker)
    lines = text[start:].splitlines()
    joined = lines[0]
    for line in lines[1:]:
        if not joined.endswith("\\"):
            break
        joined = joined[:-1] + " " + line.strip()
    return joined.split()


def test_the_readme_simulate_command_runs_from_the_repository_without_matplotlib(
    tmp_path: Path,
) -> None:
    command = _readme_command(".venv/bin/fleetgate simulate ")
    trace = command[command.index("--trace") + 1]
    assert not trace.startswith(("/", "..")) and (ROOT / trace).is_file()  # in the repository
    blocked = "import sys; sys.modules['matplotlib'] = None; " + MAIN.removeprefix("import sys; ")
    report = tmp_path / "report"
    out = subprocess.run(
        [sys.executable, "-c", blocked, *command[1:], "--report", str(report)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stderr.count("no chart: matplotlib is not installed") == 1
    assert (report / "report.json").is_file() and not (report / "simulate.png").exists()
    assert "chart: none (no matplotlib)" in out.stdout


def test_the_docs_name_no_machine_paths() -> None:
    for doc in ("README.md", "BENCHMARKS.md"):
        text = (ROOT / doc).read_text()
        assert "/work/" not in text and "/home/" not in text, doc


def test_an_answer_waits_out_a_write_longer_than_the_controller_waits(
    journal_dir: Path, tmp_path: Path
) -> None:
    """A person's answer waits for a write the controller would give up on (5 s): another
    program holding the journal 8 s does not turn `approve` into "database is locked"; a
    tick beside it fails with a line that says what held it and what to do."""
    state = tmp_path / "copy"
    shutil.copytree(journal_dir, state)
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sqlite3, sys, time\n"
         "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
         "db.execute('BEGIN IMMEDIATE'); print('held', flush=True)\n"
         "time.sleep(8); db.execute('ROLLBACK')\n",
         str(state / "journal.db")],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        environ = {**os.environ, "PYTHONPATH": str(ROOT)}
        environ.pop("FLEETGATE_STATE", None)
        answer = subprocess.Popen(
            [sys.executable, "-c", MAIN, "--state", str(state), "escalations", "approve", "1",
             "--action", "hold", "--by", "ops"],
            cwd=ROOT, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        tick = fg("--state", str(state), "tick")
        out, err = answer.communicate(timeout=120)
    finally:
        holder.wait(timeout=60)
        assert holder.stdout is not None
        holder.stdout.close()
    assert tick.returncode != 0 and "Traceback" not in tick.stderr
    assert "another connection held a write on it" in tick.stderr, tick.stderr[-2000:]
    assert "try again" in tick.stderr and "OperationalError" not in tick.stderr
    assert answer.returncode == 0, err[-2000:]
    assert out.startswith("escalation #1 approved by ops")


def test_a_second_run_on_the_same_config_is_one_line_naming_the_port(tmp_path: Path) -> None:
    """Two `fleetgate run` on one config: the second cannot have api.listen's port. It says
    so in one line, naming the key and what to do, and exits 2 (a uvicorn traceback before);
    the first goes on serving."""
    import socket

    import requests

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = config(tmp_path, f"interval_s: 1\napi:\n  listen: 127.0.0.1:{port}\n"
                 "  token: {env: FLEETGATE_TEST_API_TOKEN}\n")  # fmt: skip
    env = {"FLEETGATE_TEST_API_TOKEN": "second-run-token-0123"}
    args = ("--config", str(cfg), "--state", str(tmp_path / "state"), "run")
    environ = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    first = subprocess.Popen([sys.executable, "-c", MAIN, *args], cwd=ROOT, env=environ,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if requests.get(f"http://127.0.0.1:{port}/healthz", timeout=2).ok:
                    break
            except requests.ConnectionError:
                pass
            assert first.poll() is None and time.monotonic() < deadline, "the first run"
            time.sleep(0.1)
        second = fg(*args, env=env)
        assert second.returncode == 2, second.stderr
        assert "Traceback" not in second.stderr
        [line] = second.stderr.strip().splitlines()
        assert line.startswith(f"fleetgate: api.listen 127.0.0.1:{port}: cannot listen: ")
        assert "`fleetgate run` already running" in line
        assert requests.get(f"http://127.0.0.1:{port}/healthz", timeout=5).ok
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=60)


def real_fleet(tmp: Path, vast: Any, curio: Any, dsn: str) -> tuple[Path, dict[str, str]]:
    """A config of a real fleet on the fake vast and Curio's tables, and the environment that
    holds its secrets."""
    cfg = config(tmp, f"provider: vast\ndemand: curio\n"
                 f"vast: {{base_url: '{vast.url}', api_key: {{env: FG_TEST_VAST_KEY}}, "
                 f"image: 'img'}}\n"
                 f"curio: {{dsn: {{env: FG_TEST_CURIO_DSN}}, schema_name: {curio.schema}}}\n"
                 "api: {listen: '127.0.0.1:0', token: {env: FG_TEST_API_TOKEN}}\n"
                 "instances: {}\nescalation: {channels: [file]}\n")  # fmt: skip
    return cfg, {"FG_TEST_VAST_KEY": vast.api_key, "FG_TEST_CURIO_DSN": dsn,
                 "FG_TEST_API_TOKEN": "real-fleet-token-0123"}  # fmt: skip


def test_a_real_fleets_first_tick_says_it_made_a_new_journal(tmp_path: Path) -> None:
    """`fleetgate --config /etc/fleetgate/config.yaml tick` without the --state the service
    uses makes a journal of its own in ./.fleetgate, to which the whole account is foreign:
    the first tick says so at WARNING (so cron mails it), naming the path; the next is quiet."""
    from fakes.curio_db import CurioDB
    from fakes.vast_server import FakeVast, offer

    dsn = os.environ.get("FLEETGATE_TEST_PG_DSN",
                         "host=127.0.0.1 port=5432 dbname=test user=postgres")  # fmt: skip
    with FakeVast(offers=[offer(101)]) as vast, CurioDB(dsn) as curio:
        vast.add_instance(label="fg-1-1-0-abcdef")  # another journal's instance
        cfg, env = real_fleet(tmp_path, vast, curio, dsn)
        workdir = tmp_path / "elsewhere"
        workdir.mkdir()
        first = ok(fg("--config", str(cfg), "--log-level", "WARNING", "tick", cwd=workdir,
                      env=env))  # fmt: skip
        where = workdir / ".fleetgate" / "journal.db"
        assert f"WARNING new journal at {where}: " in first.stderr
        assert "point --state (or state_dir, or journal:) at the journal" in first.stderr
        again = ok(fg("--config", str(cfg), "--log-level", "WARNING", "tick", cwd=workdir,
                      env=env))  # fmt: skip
        assert "new journal" not in again.stderr


def test_a_tick_without_the_fleets_config_is_refused_on_its_journal(tmp_path: Path) -> None:
    """`fleetgate --state /var/lib/fleetgate tick` with the --config left out ran the
    simulator on the real fleet's journal: its listing lacked the rented instances, so they
    were recorded as gone, and the next real tick left them, still rented, as not fleetgate's.
    The journal notes its provider; a config of another is refused, changing nothing."""
    from fakes.curio_db import CurioDB
    from fakes.vast_server import FakeVast, offer

    dsn = os.environ.get("FLEETGATE_TEST_PG_DSN",
                         "host=127.0.0.1 port=5432 dbname=test user=postgres")  # fmt: skip
    with FakeVast(offers=[offer(101)]) as vast, CurioDB(dsn) as curio:
        curio.post("PoRep", 1)
        cfg, env = real_fleet(tmp_path, vast, curio, dsn)
        state = tmp_path / "state"
        for _ in range(2):  # the launch, then its instance listed
            ok(fg("--config", str(cfg), "--state", str(state), "tick", env=env))
        before = ok(fg("--config", str(cfg), "--state", str(state), "status", env=env)).stdout
        assert "instances 1 " in before, before
        for command in ("tick", "explain"):
            out = fg("--state", str(state), command)
            assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
            assert "records the fleet of provider 'vast', and the config's provider is " \
                   "'sim'" in out.stderr, out.stderr  # fmt: skip
        ok(fg("--config", str(cfg), "--state", str(state), "tick", env=env))
        after = ok(fg("--config", str(cfg), "--state", str(state), "status", env=env)).stdout
        assert "instances 1 " in after and "not fleetgate's" not in after, after
    sim_state = tmp_path / "sim"
    ok(fg("--state", str(sim_state), "tick"))
    out = fg("--config", str(cfg), "--state", str(sim_state), "tick", env=env)
    assert out.returncode == 2 and "records the fleet of provider 'sim'" in out.stderr


def test_each_commands_help_says_what_it_does_and_where_the_state_is() -> None:
    """`fleetgate run --help` (and every command's) opens with what the command does, as the
    top-level list says it; --state names every place it comes from, in the order used
    (the cron file sets $FLEETGATE_STATE, which a config's state_dir overrides)."""
    top = ok(fg("--help")).stdout
    for command in ("run", "tick", "check", "status", "pause", "prune", "init"):
        said = ok(fg(command, "--help")).stdout
        summary = top.split(f"\n    {command} ", 1)[1].split("\n", 1)[0].strip()
        assert f"\n\n{summary}\n" in said, (command, said)
        flat = " ".join(said.split())
        assert "(default: the config's state_dir, else $FLEETGATE_STATE, else ./.fleetgate)" in flat
    approve = ok(fg("escalations", "approve", "--help")).stdout
    assert "\n\napprove one (optionally another action or parameters)\n" in approve


@pytest.mark.parametrize("text", [
    "state_dir: 5\nguards: {max_instancs: 4}\n",  # where the journal is: not guessed
    "journal: {dsn: 5}\n",
    "guards: [\n",  # YAML that does not parse
])  # fmt: skip
def test_the_brake_refuses_a_config_whose_journal_it_cannot_place(
    text: str, tmp_path: Path, journal_dir: Path
) -> None:
    cfg = config(tmp_path, text)
    out = fg("--config", str(cfg), "--state", str(journal_dir), "pause")
    assert out.returncode == 2 and "fleetgate.yaml:" in out.stderr and not out.stdout
    assert "Traceback" not in out.stderr


def test_status_says_what_an_answer_and_the_launches_have_set_in_motion(
    journal_dir: Path, tmp_path: Path
) -> None:
    """Right after an approval `status` said nothing of it until the next tick carried it out
    ("pending escalations: 0"), nor of launches rented and not listed yet ("instances 0")."""
    state = tmp_path / "copy"
    shutil.copytree(journal_dir, state)
    ok(fg("--state", str(state), "escalations", "approve", "1", "--action", "hold", "--by", "ops"))
    lines = ok(fg("--state", str(state), "status")).stdout.splitlines()
    assert "pending escalations: 0; approved, carried out at the next tick: 1" in lines, lines
    ok(fg("--state", str(state), "tick"))
    lines = ok(fg("--state", str(state), "status")).stdout.splitlines()
    assert not any("approved, carried out" in line for line in lines), lines


def test_check_connect_reads_vast_and_curio_once_and_names_what_is_wrong(
    tmp_path: Path,
) -> None:
    """`check` connects to nothing, so a wrong vast key or Curio DSN showed only at the
    service's first tick. `check --connect` reads vast's listing and Curio's queue once,
    writing nothing (no journal is made), and says which is wrong and where to look."""
    from fakes.curio_db import CurioDB
    from fakes.vast_server import FakeVast

    dsn = os.environ.get("FLEETGATE_TEST_PG_DSN",
                         "host=127.0.0.1 port=5432 dbname=test user=postgres")  # fmt: skip
    with FakeVast() as vast, CurioDB(dsn) as curio:
        vast.add_instance(label="someone-elses")
        curio.post("PoRep", 3)
        cfg, good = real_fleet(tmp_path, vast, curio, dsn)
        state = tmp_path / "state"
        out = ok(fg("--config", str(cfg), "--state", str(state), "check", "--connect", env=good))
        assert "ok: vast answered: 1 instance(s) on the account" in out.stdout, out.stdout
        assert f"ok: Curio answered: 3 task(s) pending in schema '{curio.schema}'" in out.stdout
        wrong_key = {**good, "FG_TEST_VAST_KEY": "not-the-key-0123456789"}
        out = fg("--config", str(cfg), "--state", str(state), "check", "--connect", env=wrong_key)
        assert out.returncode == 1 and "failed: vast: " in out.stderr
        assert "check vast.api_key" in out.stderr and "not-the-key" not in out.stderr
        wrong_dsn = {**good, "FG_TEST_CURIO_DSN": "host=127.0.0.1 port=1 dbname=test"}
        out = fg("--config", str(cfg), "--state", str(state), "check", "--connect", env=wrong_dsn)
        assert out.returncode == 1 and "failed: Curio: cannot connect" in out.stderr
        assert "check curio.dsn" in out.stderr
        assert "Traceback" not in out.stderr and not state.exists()  # nothing written


def test_the_env_files_values_with_spaces_reach_a_cron_tick_whole(tmp_path: Path) -> None:
    """The cron lines read /etc/fleetgate/env with sh, the service with systemd's
    EnvironmentFile=, which takes `CURIO_DSN=host=db port=5433` unquoted: sh ran `port=5433`
    as a second assignment and cron's tick connected to `host=db` alone. The cron file's
    header shows the quoting both read alike; each of its examples, sourced as its lines
    source the file, gives the value systemd reads."""
    text = (ROOT / "deploy" / "fleetgate-tick.cron").read_text()
    examples = [line[1:].strip() for line in text.splitlines()
                if re.match(r"#\s+[A-Z_]+='", line)]  # fmt: skip
    assert any(" " in line for line in examples), "the header shows no quoted value"
    (tmp_path / "env").write_text("".join(f"{line}\n" for line in examples))
    for line in examples:
        name, quoted = line.split("=", 1)
        systemd = quoted[1:-1]  # EnvironmentFile=: single quotes removed, nothing expanded
        script = f'set -a; . ./env; set +a; printf %s "${name}"'
        shown = subprocess.run(["/bin/sh", "-c", script], cwd=tmp_path, capture_output=True,
                               text=True, timeout=60)  # fmt: skip
        assert shown.stderr == "" and shown.stdout == systemd, (line, shown)
    assert "deploy/fleetgate-tick.cron" in (ROOT / "deploy" / "fleetgate.service").read_text()


def test_an_escalations_commands_run_when_pasted_where_fleetgate_is_on_no_path(
    tmp_path: Path,
) -> None:
    """A message said `fleetgate --config ... escalations deny 1`; a controller started as
    .venv/bin/fleetgate (`make run`) or /opt/fleetgate/bin/fleetgate (the unit) is on no
    shell's PATH, so the line pasted was `command not found`. It names the fleetgate that ran."""
    exe = str(Path(sys.executable).with_name("fleetgate"))
    rules = tmp_path / "rules"
    rules.mkdir()
    shutil.copy(ROOT / "rules" / "hosts.yaml", rules)  # nothing claims the demand: escalated
    cfg = config(tmp_path, f"rules: [{rules}]\nescalation: {{channels: [console]}}\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    out = subprocess.run([exe, "--config", str(cfg), "--state", str(tmp_path / "state"),
                          "--log-level", "WARNING", "tick"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr
    deny = next(ln for ln in (out.stdout + out.stderr).splitlines() if ln.startswith("Deny:"))
    command = deny.split(None, 1)[1]
    assert command.startswith(f"{exe} --config "), command
    pasted = subprocess.run(["/bin/sh", "-c", command], env=env, cwd=ROOT, capture_output=True,
                            text=True, timeout=300)  # fmt: skip
    assert pasted.returncode == 0, pasted.stderr


def test_status_names_the_journals_provider_and_says_when_the_config_is_anothers(
    tmp_path: Path,
) -> None:
    """`status` with the --config left out (or another fleet's) printed the config's provider
    over the journal's fleet; it prints the journal's, and says on stderr that `run` and
    `tick` refuse that config."""
    state = tmp_path / "state"
    ok(fg("--state", str(state), "tick"))  # the simulator's journal
    cfg = config(tmp_path, "provider: vast\ndemand: curio\n"
                 "vast: {api_key: {env: FG_TEST_UNSET_KEY}, image: img}\n"
                 "curio: {dsn: {env: FG_TEST_UNSET_DSN}}\ninstances: {}\n"
                 "api: {token: {env: FG_TEST_UNSET_TOKEN}}\n")  # fmt: skip
    out = ok(fg("--config", str(cfg), "--state", str(state), "status"))
    assert out.stdout.startswith("provider sim "), out.stdout
    assert ("fleetgate: warning: provider: the journal records the fleet of provider 'sim', and "
            "the config's provider is 'vast' (see --config); `run` and `tick` refuse to "
            "start") in out.stderr.splitlines(), out.stderr  # fmt: skip
    quiet = ok(fg("--state", str(state), "status"))
    assert quiet.stdout.startswith("provider sim ") and quiet.stderr == "", quiet.stderr
