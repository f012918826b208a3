"""The README's first walk, as a person does it: remove `replace-frozen-instance`, run the
simulator slowly enough to answer, and approve escalation #1 with the printed command from
another terminal while it runs."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from test_cli_ops import MAIN, ROOT, fg, ok

README = (ROOT / "README.md").read_text()


def _printed(prefix: str) -> list[str]:
    """The README's lines of its "What you see" section that start with `prefix`."""
    section = README[README.index("## What you see") : README.index("## How it works")]
    return [line.strip() for line in section.splitlines() if line.strip().startswith(prefix)]


def _without_rule(text: str, name: str) -> str:
    """The rules file as a person edits it: the rule's lines deleted, up to the next rule."""
    lines, out, skipping = text.splitlines(keepends=True), [], False
    for line in lines:
        if line.startswith("  - name: "):
            skipping = line.strip() == f"- name: {name}"
        if not skipping:
            out.append(line)
    return "".join(out)


def test_the_printed_slow_pace_is_a_config_fleetgate_accepts(tmp_path: Path) -> None:
    [printf] = _printed("printf 'interval_s:")
    subprocess.run(["bash", "-c", printf], cwd=tmp_path, check=True)
    [run] = _printed(".venv/bin/fleetgate --config slow.yaml run")
    assert run.split()[1:3] == ["--config", "slow.yaml"]
    out = ok(fg("--config", str(tmp_path / "slow.yaml"), "check", cwd=tmp_path))
    assert out.stdout.startswith("ok: ")
    assert (tmp_path / "slow.yaml").read_text() == "interval_s: 3\n"


def test_escalation_one_is_answered_by_the_printed_command_while_it_runs(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "rules", tmp_path / "rules")
    lifecycle = tmp_path / "rules" / "lifecycle.yaml"
    edited = _without_rule(lifecycle.read_text(), "replace-frozen-instance")
    assert "name: replace-frozen-instance" not in edited
    lifecycle.write_text(edited)
    # the README's pace is a tick every 3 s; a tenth of it keeps this test short and still
    # leaves 9 s of real time before the 30-minute deadline
    (tmp_path / "pace.yaml").write_text("interval_s: 0.3\n")
    env = {k: v for k, v in os.environ.items() if k != "FLEETGATE_STATE"}
    proc = subprocess.Popen(
        [sys.executable, "-c", MAIN, "--config", "pace.yaml", "run"],
        cwd=tmp_path, env={**env, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        first = _first_pending(tmp_path, deadline=time.monotonic() + 240)
        assert first["id"] == 1 and first["subject"].startswith("instance:"), first
        assert first["kind"] == "unmatched"
        [approve] = [c for c in _printed(".venv/bin/fleetgate escalations approve")]
        command = approve.split("#")[0].split()[1:]
        answered = ok(fg(*command, cwd=tmp_path))
        assert answered.stdout.startswith("escalation #1 approved by ")
        assert " replace instance=" + first["subject"].split(":")[1] in answered.stdout
        executed = _wait_status(tmp_path, 1, ("executed", "failed"), time.monotonic() + 60)
        assert executed == "executed"
    finally:
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, output[-3000:]
    assert "WARNING ESCALATION #1 unmatched instance:" in output
    acts = json.loads(ok(fg("actions", "--json", cwd=tmp_path)).stdout)
    replaced = [a for a in acts if a["action"] == "replace"]
    assert any(str(a.get("escalation_id")) == "1" for a in replaced), replaced


def _escalations(cwd: Path) -> list[dict[str, object]]:
    out = fg("escalations", "list", "--json", cwd=cwd)
    return list(json.loads(out.stdout)) if out.returncode == 0 else []


def _first_pending(cwd: Path, deadline: float) -> dict[str, object]:
    while time.monotonic() < deadline:
        pending = [e for e in _escalations(cwd) if e["status"] == "pending"]
        if pending:
            return min(pending, key=lambda e: int(str(e["id"])))
        time.sleep(0.2)
    raise AssertionError("no escalation within the time allowed")


def _wait_status(cwd: Path, esc: int, wanted: tuple[str, ...], deadline: float) -> str:
    status = ""
    while time.monotonic() < deadline:
        status = next((str(e["status"]) for e in _escalations(cwd) if e["id"] == esc), "")
        if status in wanted:
            return status
        time.sleep(0.3)
    return status
