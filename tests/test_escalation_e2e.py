"""Escalation end to end on the simulator: the LLM first, people when it cannot settle it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes.openai_server import FakeOpenAI, RawBody, closed_port_url
from support import SimApps, rules_leaving_frozen_to_people
from test_cli_ops import fg, ok

from controller.service.app import App
from controller.service.config import Config, parse_config

KEY = "sk-test-llm-key-0123456789"


def config(base_url: str, extra: str = "", require_check: bool = False) -> Config:
    text = (
        "interval_s: 0.01\n"
        "escalation:\n"
        f"  llm: {{base_url: '{base_url}', model: fake-model, api_key: {{env: FG_TEST_LLM_KEY}},\n"
        f"        retries: 1, timeout_s: 5, require_check: {str(require_check).lower()}}}\n"
        "  deadline_s: 864000\n" + extra
    )
    return parse_config("test.yaml", text)


@pytest.fixture(autouse=True)
def llm_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FG_TEST_LLM_KEY", KEY)


@pytest.fixture
def app_factory(tmp_path: Path) -> Iterator[Any]:
    apps = SimApps(tmp_path)
    yield apps.make
    apps.close()


def ticks_until(app: App, done: Any, limit: int = 500) -> int:
    for n in range(limit):
        app.controller.tick()
        if done():
            return n
    raise AssertionError(f"condition not reached in {limit} ticks")


def unmatched(app: App) -> list[dict[str, Any]]:
    return [e for e in app.journal.escalations.recent() if e["kind"] == "unmatched"]


def test_an_unmatched_status_gets_one_llm_call_whose_answer_runs_through_the_guards(
    app_factory: Any,
) -> None:
    with FakeOpenAI(default="smart") as fake:
        app = app_factory(config(fake.url))
        ticks_until(app, lambda: any(e["status"] == "executed" for e in unmatched(app)))
        for _ in range(60):  # an hour more: the same situation must not be asked about again
            app.controller.tick()
        esc = next(e for e in unmatched(app) if e["status"] == "executed")
        [call] = app.journal.llm.llm_calls(esc["id"])
        assert call["status"] == "ok" and call["action"] == "replace" and call["routed"] == "act"
        assert call["prompt_digest"] and call["confidence"] >= 0.8
        subject = esc["subject"].split(":")[1]
        assert call["params"]["instance"] == subject
        acts = [
            a
            for a in app.journal.actions.actions_for_escalation(esc["id"])
            if a["parent_id"] is None
        ]
        assert [(a["action"], a["proposer"], a["status"]) for a in acts] == [
            ("replace", "llm:fake-model", "ok")
        ]
        assert "confidence" in acts[0]["why"]
        # one LLM call per situation (fingerprint), never one per tick
        fingerprints = [e["fingerprint"] for e in app.journal.escalations.recent()]
        calls = app.journal.llm.llm_calls()
        assert len(fake.chat_bodies) == len(calls) == len(fingerprints)
        assert len(set(fingerprints)) == len(fingerprints)
        # the key went to the endpoint as a bearer header, never into the prompt
        assert fake.requests[-1].headers.get("Authorization") == f"Bearer {KEY}"
        assert KEY not in json.dumps(fake.chat_bodies)


def test_garbage_from_the_llm_goes_to_people_whose_approval_runs_next_tick(
    app_factory: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with FakeOpenAI(default="never_tools") as fake:
        fake.script(RawBody("{not json"))
        app = app_factory(config(fake.url))
        ticks_until(app, lambda: bool(unmatched(app)))
        esc = unmatched(app)[0]
        assert esc["status"] == "pending"
        [call] = app.journal.llm.llm_calls(esc["id"])
        assert call["status"] in ("invalid", "unavailable") and call["routed"] == "people"
        out = capsys.readouterr().out
        assert f"ESCALATION #{esc['id']}" in out and "Why you:" in out
        lines = (tmp_path / "state" / "escalations.jsonl").read_text().splitlines()
        assert any(json.loads(line)["id"] == esc["id"] for line in lines)
        from escalation import approvals

        approvals.approve(app.journal, esc["id"], by="ana", now=app.controller.clock(),
                          action="replace")  # fmt: skip
        app.controller.tick()
        acts = [
            a
            for a in app.journal.actions.actions_for_escalation(esc["id"])
            if a["parent_id"] is None
        ]
        assert [(a["action"], a["proposer"], a["status"]) for a in acts] == [
            ("replace", "human:ana", "ok")
        ]
        chain = app.journal.escalations.escalation(esc["id"])
        assert (
            chain and chain["status"] == "executed" and chain["executed_action_id"] == acts[0]["id"]
        )


def test_an_endpoint_that_is_down_means_people_not_silence(
    app_factory: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    app = app_factory(config(closed_port_url()))
    ticks_until(app, lambda: bool(unmatched(app)))
    esc = unmatched(app)[0]
    [call] = app.journal.llm.llm_calls(esc["id"])
    assert call["status"] == "unavailable" and call["routed"] == "people"
    assert f"ESCALATION #{esc['id']}" in capsys.readouterr().out
    assert app.journal.escalations.deliveries(esc["id"])
    # `escalations show` says the call failed and why, with no confidence it never had
    shown = ok(fg("--state", str(app.journal.path.parent), "escalations", "show", str(esc["id"])))
    [line] = [x for x in shown.stdout.splitlines() if x.startswith("  llm ")]
    assert " fake-model unavailable: - cannot connect to the model at " in line, line
    assert "None" not in line


def test_an_llm_answer_the_guards_refuse_goes_to_people(
    app_factory: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    with FakeOpenAI(default="smart") as fake:
        app = app_factory(config(fake.url))
        ticks_until(app, lambda: any(e["status"] == "approved" for e in unmatched(app)))
        esc = next(e for e in unmatched(app) if e["status"] == "approved")
        app.journal.meta.put("paused", True)  # now the guards refuse every fleet change
        capsys.readouterr()
        app.controller.tick()
        after = app.journal.escalations.escalation(esc["id"])
        assert after and after["status"] == "vetoed"
        refused = [e for e in app.journal.escalations.recent() if e["kind"] == "guard_veto"]
        assert refused and "llm:fake-model" in refused[-1]["summary"]
        assert not app.journal.llm.llm_calls(refused[-1]["id"])  # people decide, not the LLM again
        assert f"ESCALATION #{refused[-1]['id']}" in capsys.readouterr().out


def _cli(args: list[str], cfg: Path, state: Path) -> Any:
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    cmd = [
        sys.executable,
        "-c",
        "import sys; from controller.service.cli import main; sys.exit(main())",
    ]
    env = dict(os.environ, FG_TEST_LLM_KEY=KEY)
    return subprocess.run([*cmd, "--config", str(cfg), "--state", str(state), *args], cwd=root,
                          capture_output=True, text=True, timeout=120, env=env)  # fmt: skip


def _config_file(tmp_path: Path, url: str, require: bool | None = False, gate: str = "") -> Path:
    cfg = tmp_path / "llm.yaml"
    check = "" if require is None else f", require_check: {str(require).lower()}"
    cfg.write_text(
        gate + "escalation:\n"
        f"  llm: {{base_url: '{url}', model: fake-model, api_key: {{env: FG_TEST_LLM_KEY}},\n"
        f"        retries: 0, timeout_s: 5{check}}}\n"
    )
    return cfg


def test_llm_check_passes_against_a_tool_calling_model_and_fails_without_tools(
    tmp_path: Path,
) -> None:
    with FakeOpenAI(default="smart") as good:
        out = _cli(["llm-check"], _config_file(tmp_path, good.url), tmp_path / "s1")
        assert out.returncode == 0, out.stdout + out.stderr
        assert "PASS" in out.stdout and "probes passed" in out.stdout
    with FakeOpenAI(default="never_tools") as bad:
        out = _cli(["llm-check"], _config_file(tmp_path, bad.url), tmp_path / "s2")
        assert out.returncode == 1
        assert "FAIL: 0% of probes passed" in out.stdout and "no tool call" in out.stdout


def test_require_check_keeps_the_llm_off_until_a_check_passed(tmp_path: Path) -> None:
    state = tmp_path / "s"
    with FakeOpenAI(default="smart") as fake:
        cfg = _config_file(tmp_path, fake.url, require=True)
        out = _cli(["tick"], cfg, state)
        said = re.search(r"LLM escalation is off until `([^`]+)` passes", out.stderr)
        assert said, out.stderr
        # the check it names, run as pasted into a shell elsewhere (it named no --config)
        assert said.group(1) == (f"fleetgate --config {cfg.absolute()} --state "
                                 f"{state.absolute()} llm-check")  # fmt: skip
        env = dict(os.environ, FG_TEST_LLM_KEY=KEY,
                   PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")  # fmt: skip
        run = subprocess.run(["bash", "-c", said.group(1)], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=120)  # fmt: skip
        assert run.returncode == 0, run.stdout + run.stderr
        out = _cli(["tick"], cfg, state)
        assert out.returncode == 0 and "LLM escalation is off" not in out.stderr


def test_an_unchecked_model_never_acts_by_default_but_may_propose(tmp_path: Path) -> None:
    """`require_check` unset: on in `act` mode (the default gate), off when answers only
    propose."""
    with FakeOpenAI(default="smart") as fake:
        out = _cli(["tick"], _config_file(tmp_path, fake.url, require=None), tmp_path / "a")
        assert "LLM escalation is off until `fleetgate --config " in out.stderr
        proposing = _config_file(tmp_path, fake.url, require=None, gate="gate: {mode: propose}\n")
        out = _cli(["tick"], proposing, tmp_path / "p")
        assert out.returncode == 0 and "LLM escalation is off" not in out.stderr


def test_a_budget_override_is_explicit_journaled_and_never_the_llms(
    app_factory: Any, tmp_path: Path
) -> None:
    from escalation import approvals

    cfg = config(closed_port_url(), "guards: {max_spend_per_hour: 1.0}\n")
    app = app_factory(cfg)
    ticks_until(
        app, lambda: any(e["kind"] == "guard_veto" for e in app.journal.escalations.recent())
    )
    esc = next(e for e in app.journal.escalations.recent() if e["kind"] == "guard_veto")
    with pytest.raises(approvals.ApprovalError, match="cannot override"):
        approvals.approve(
            app.journal,
            esc["id"],
            by="ana",
            now=app.controller.clock(),
            action="launch",
            params={"count": 1},
            override=["min_instances"],
        )
    approvals.approve(
        app.journal,
        esc["id"],
        by="ana",
        now=app.controller.clock(),
        action="launch",
        params={"count": 1},
        override=["max_spend_per_hour"],
    )
    app.controller.tick()
    [act] = [
        a for a in app.journal.actions.actions_for_escalation(esc["id"]) if a["parent_id"] is None
    ]
    assert act["status"] == "ok" and "budget override by human:ana" in act["why"]
    answer = app.journal.escalations.escalation(esc["id"])
    assert answer and answer["answer"]["override"] == ["max_spend_per_hour"]
    # an LLM's approval never carries an override, even if the stored answer had one
    llm_esc = app.journal.escalations.add_escalation(fingerprint="x", kind="unmatched",
                                                     subject="fleet", summary="s", now=1.0,
                                                     deadline=9e9, situation={},
                                                     default_action={})  # fmt: skip
    app.journal.escalations.answer(llm_esc, status="approved", by="llm:m", now=2.0,
                                   answer={"action": "launch", "params": {"count": 1},
                                           "override": ["max_spend_per_hour"]})  # fmt: skip
    [p] = [p for p in approvals.approved_proposals(app.journal) if p.escalation_id == llm_esc]
    assert p.overrides == () and p.proposer == "llm:m"


def test_an_unchecked_model_does_not_act_when_sighup_lets_answers_act(tmp_path: Path) -> None:
    """Started with answers proposing only, an unchecked model reads (`require_check` unset is
    off then); SIGHUP that sets `gate.mode: act` must not let its answers act before
    `fleetgate llm-check` passed (they went to the guards and replaced instances): its answer
    goes to people, the escalation left pending."""
    from controller.service.assemble import assemble
    from controller.service.config import load_config
    from controller.service.hup import ConfigReload

    rules = rules_leaving_frozen_to_people(tmp_path / "rules")
    with FakeOpenAI(default="smart") as fake:
        cfg = _config_file(tmp_path, fake.url, require=None, gate="gate: {mode: propose}\n")
        text = cfg.read_text() + f"  deadline_s: 864000\nrules: ['{rules}']\ninterval_s: 0.01\n"
        cfg.write_text(text)
        app = assemble(load_config(str(cfg)), state=tmp_path / "state", clock=time.time,
                       sleep=time.sleep, seed=7)  # fmt: skip
        try:
            assert app.controller.escalator.reader is not None  # proposing: it reads
            cfg.write_text(text.replace("mode: propose", "mode: act"))
            hup = ConfigReload(app, str(cfg))
            hup.request()
            assert (hup.apply() or {})["applied"] == ["gate"]
            ticks_until(app, lambda: bool(app.journal.llm.llm_calls()))
            [call] = app.journal.llm.llm_calls()
            assert call["action"] == "replace" and call["routed"] == "people"
            esc = app.journal.escalations.escalation(call["escalation_id"])
            assert esc and esc["status"] == "pending"
            assert not [a for a in app.journal.actions.recent(limit=1000)
                        if a["proposer"].startswith("llm:")]  # fmt: skip
        finally:
            app.close()


def test_people_read_that_the_llm_is_off_until_its_check_not_that_none_is_configured(
    app_factory: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """`require_check` and no passed check: the reader is off, and the message says so and
    that `fleetgate run` takes a passed check when restarted (it said "Why you: no LLM reader
    is configured", with one configured)."""
    with FakeOpenAI(default="smart") as fake:
        app = app_factory(config(fake.url, require_check=True))
        assert app.controller.escalator.reader is None
        ticks_until(app, lambda: bool(unmatched(app)))
        out = capsys.readouterr().out
        assert "Why you: the LLM is off until `fleetgate --state " in out  # its own journal
        assert "llm-check` passes for model 'fake-model'" in out
        assert "restart `fleetgate run`" in out
        assert "no LLM reader is configured" not in out and not fake.chat_bodies
