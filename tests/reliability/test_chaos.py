"""The fault-injection suite at CI size: every harm counter is 0 and the faults really landed.
`tests/reliability/run_chaos.py --full` runs the same scenarios at full size."""

from __future__ import annotations

from typing import Any

from reliability import chaos


def assert_harmless(name: str, result: dict[str, Any]) -> None:
    harms = {k: result[k] for k in chaos.HARMS[name]}
    assert all(v == 0 for v in harms.values()), (harms, result["details"][:20])


def test_provider_faults_never_duplicate_launch_or_destroy_wrongly() -> None:
    r = chaos.provider_faults(60, seed=1)
    assert_harmless("provider_faults", r)
    assert r["faults_injected"] > 20 and r["creates"] > 0 and r["destroys"] > 0
    assert r["vetoes_sensing"] > 0 and r["sensing_escalations"] > 0


def test_fuzzed_rules_fail_cleanly_and_keep_the_last_good_rules() -> None:
    r = chaos.fuzzed_rules(100, seed=1)
    assert_harmless("fuzzed_rules", r)
    assert r["rejected"] > 30 and r["reloads_failed"] > 30 and r["reloads_ok"] > 0


def test_adversarial_llm_answers_never_act_beyond_the_guards() -> None:
    r = chaos.adversarial_llm(30, seed=1)
    assert_harmless("adversarial_llm", r)
    assert r["llm_calls"] == 30 and r["to_people"] > 0 and r["acted"] > 0
    assert r["distinct_kinds"] >= 10 and r["vetoed"] + r["trimmed"] > 0


def test_no_configured_secret_in_prompts_messages_logs_or_journal() -> None:
    r = chaos.secrets_scan()
    assert_harmless("secrets_scan", r)
    assert r["llm_calls"] > 0 and r["key_in_auth_header"] == r["llm_calls"]
    assert r["messages"] > 0 and r["log_lines"] > 0
