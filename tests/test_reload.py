"""Hot reload of rules: a good edit takes effect, a bad one keeps the last good rules; every
reload is journaled; SIGHUP asks for one at once."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.service.app import App
from controller.service.assemble import assemble
from controller.service.config import Config

ROOT = Path(__file__).resolve().parent.parent


def rules_copy(tmp_path: Path) -> Path:
    rules = tmp_path / "rules"
    shutil.copytree(ROOT / "rules", rules, ignore=shutil.ignore_patterns("tests"))
    return rules


def touch_later(path: Path, text: str) -> None:
    path.write_text(text)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # a visible change


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[tuple[Path, App]]:
    """A copy of the shipped rules, and a controller on the simulator (on the wall clock)
    reading them."""
    rules = rules_copy(tmp_path)
    app = assemble(Config(), state=tmp_path / "state", clock=time.time, sleep=time.sleep,
                   seed=7, rules=[str(rules)])  # fmt: skip
    try:
        yield rules, app
    finally:
        app.close()


def break_(path: Path, good: str) -> None:
    """A bad edit of the crash rules: an operator `greater` that does not exist."""
    touch_later(path, good.replace("restarts_1h: {lt: 3}", "restarts_1h: {greater: 3}"))


def test_a_good_edit_takes_effect_and_a_bad_one_keeps_the_last_good_rules(
    sim: tuple[Path, App],
) -> None:
    rules, app = sim
    ctl = app.controller
    first = ctl.rules.book.digest
    ctl.tick()
    crashes = rules / "crashes.yaml"
    touch_later(crashes, crashes.read_text().replace("confidence: 0.95", "confidence: 0.96"))
    ctl.tick()
    second = ctl.rules.book.digest
    assert second != first
    break_(crashes, crashes.read_text())
    ctl.tick()
    ctl.tick()  # an unchanged bad file is not reported again
    assert ctl.rules.book.digest == second  # the last good rules stay in force
    reloads = app.journal.meta.reloads()
    assert [(r["ok"], r["digest"]) for r in reloads] == [(1, second), (0, second)]
    assert "crashes.yaml:" in reloads[1]["problems"] and "greater" in reloads[1]["problems"]
    ticks = app.journal.meta.ticks(4)
    assert [t["rules"] for t in ticks][::-1] == [first, second, second, second]


def test_a_bad_edit_undone_is_journaled_as_a_good_reload(sim: tuple[Path, App]) -> None:
    # the undone files read as the rules in force: nothing new to load, but the journal's last
    # word (the dashboard's "reload failed") must not stay the failure
    rules, app = sim
    ctl = app.controller
    first = ctl.rules.book.digest
    crashes = rules / "crashes.yaml"
    good = crashes.read_text()
    break_(crashes, good)
    ctl.tick()
    touch_later(crashes, good)
    ctl.tick()
    touch_later(crashes, good)  # touched again, unchanged: nothing more to say
    ctl.tick()
    reloads = app.journal.meta.reloads()
    assert [(r["ok"], r["digest"]) for r in reloads] == [(0, first), (1, first)]
    assert ctl.rules.book.digest == first


def test_a_file_emptied_mid_save_keeps_its_rules_until_it_holds_rules_again(
    sim: tuple[Path, App],
) -> None:
    # an editor truncates, then writes: every file caught at 0 bytes would load as no rules
    rules, app = sim
    ctl = app.controller
    first, count_before = ctl.rules.book.digest, len(ctl.rules.book.rules)
    texts = {f: f.read_text() for f in rules.glob("*.yaml")}
    for f in texts:
        touch_later(f, "")
    ctl.tick()
    assert ctl.rules.book.digest == first and len(ctl.rules.book.rules) == count_before
    [failed] = app.journal.meta.reloads()
    assert failed["ok"] == 0 and "crashes.yaml: is empty, but rules" in failed["problems"]
    assert "delete the file to drop its rules" in failed["problems"]
    for f, text in texts.items():
        touch_later(f, text.replace("confidence: 0.95", "confidence: 0.96"))
    ctl.tick()
    assert ctl.rules.book.digest != first and len(ctl.rules.book.rules) == count_before
    # a file deleted is its rules withdrawn
    gone = len([r for r in ctl.rules.book.rules if r.path.endswith("crashes.yaml")])
    (rules / "crashes.yaml").unlink()
    ctl.tick()
    assert gone and len(ctl.rules.book.rules) == count_before - gone
    assert [r["ok"] for r in app.journal.meta.reloads()] == [0, 1, 1]


def count(db: Path, table: str) -> int:
    try:
        return int(sqlite3.connect(db).execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])
    except sqlite3.Error:  # not created yet
        return 0


def test_sighup_rereads_the_rules(tmp_path: Path) -> None:
    rules = rules_copy(tmp_path)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"interval_s: 0.2\nrules: ['{rules}']\nescalation: {{channels: [file]}}\n")
    state = tmp_path / "s"
    code = "import sys; from controller.service.cli import main; sys.exit(main())"
    cmd = [sys.executable, "-c", code, "--config", str(cfg), "--state", str(state), "run"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    try:
        db = state / "journal.db"
        deadline = time.monotonic() + 60
        while not db.exists() or not count(db, "ticks"):
            assert time.monotonic() < deadline, "no tick"
            time.sleep(0.1)
        # same size and mtime: only SIGHUP makes it look again
        crashes = rules / "crashes.yaml"
        st = crashes.stat()
        text = crashes.read_text().replace("confidence: 0.95", "confidence: 0.94")
        crashes.write_text(text)
        os.utime(crashes, ns=(st.st_atime_ns, st.st_mtime_ns))
        proc.send_signal(signal.SIGHUP)
        while not count(db, "rule_reloads"):
            assert time.monotonic() < deadline, "no reload after SIGHUP"
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "SIGHUP: the rules are read again" in err
