"""`--log-format json`: an action's line carries its fields (tick, action, outcome, target,
instance, rule, proposer, escalation) beside the text, so a log pipeline can filter on them;
a tick's summary line carries the tick."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAIN = "import sys; from controller.service.cli import main; sys.exit(main())"


def test_action_lines_carry_their_fields(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("FLEETGATE_STATE", "NOTIFY_SOCKET")}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", MAIN, "--state", str(tmp_path / "s"),
                          "--log-format", "json", "run", "--ticks", "60"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    records = [json.loads(line) for line in out.stderr.splitlines() if line.startswith("{")]
    acted = [r for r in records if r["logger"] == "controller.service.apply" and "action" in r]
    assert acted, out.stderr[-2000:]
    for r in acted:
        assert isinstance(r["tick"], int) and r["tick"] >= 1
        assert r["action"] in r["msg"] and r["outcome"] in r["msg"]
        assert isinstance(r["action_id"], int)
        if r["proposer"].startswith("rule:"):
            assert r["rule"] == r["proposer"][5:] and f"rule {r['rule']}:" in r["msg"]
        if r["target"].startswith("instance:"):
            assert r["instance"] == r["target"].split(":", 1)[1]
            assert f"instance={r['instance']}" in r["msg"]
    assert any("instance" in r for r in acted), [r["msg"] for r in acted]  # e.g. a restart
    assert any("rule" in r for r in acted)
    summaries = [r for r in records if r["logger"] == "controller.service.tick"
                 and " tick " in r["msg"]]  # fmt: skip
    assert summaries and all(f"tick {r['tick']}:" in r["msg"] for r in summaries)


def test_a_secret_in_a_traceback_is_redacted_in_both_formats() -> None:
    """The Redactor scrubbed a log line's message but not its traceback: an exception whose
    text quoted a webhook's URL was logged whole by `log.exception`."""
    script = (
        "import logging\n"
        "from controller.service import cli\n"
        "from controller.service.secrets import SecretRef\n"
        "SecretRef(env='S').resolve({'S': 'hook-path-0123456789'})\n"
        "for fmt in ('text', 'json'):\n"
        "    cli._logging('INFO', fmt)\n"
        "    try:\n"
        "        raise ValueError('no answer from http://h/hook-path-0123456789')\n"
        "    except ValueError:\n"
        "        logging.getLogger('x').exception('delivery failed')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "hook-path-0123456789" not in out.stderr, out.stderr
    text, line = out.stderr.split("\n{", 1)
    assert "ValueError: no answer from http://h/[redacted]" in text
    assert json.loads("{" + line)["exc"].endswith("ValueError: no answer from http://h/[redacted]")
