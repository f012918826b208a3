"""escalation/llm_check.py: the probes through the real client against the fake server."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests
from fakes.openai_server import FakeOpenAI, ToolCall, closed_port_url

from escalation.llm import LLMClient, LLMSettings, MemoryUsage
from escalation.llm_check import (
    INJECTION,
    PROBES,
    CheckReport,
    Probe,
    ProbeResult,
    check_passes,
    format_report,
    run_check,
)
from escalation.render import Renderer


@pytest.fixture
def client_for() -> Iterator[Callable[..., LLMClient]]:
    http = requests.Session()
    http.trust_env = False  # 127.0.0.1 directly, whatever HTTP_PROXY says

    def make(url: str, **settings: Any) -> LLMClient:
        s = LLMSettings(**{"base_url": url, "model": "fake-model", "timeout_s": 5, **settings})
        return LLMClient(s, Renderer(), MemoryUsage(), http, sleep=lambda _: None)

    with http:
        yield make


def probe(name: str) -> Probe:
    return next(p for p in PROBES if p.name == name)


def answer(name: str, **params: Any) -> ToolCall:
    return ToolCall(name, {"confidence": 0.9, "rationale": "scripted", **params})


@pytest.mark.parametrize("mode", ["tools", "json_schema"])
def test_the_smart_fake_passes_every_probe(client_for: Callable[..., LLMClient], mode: str) -> None:
    with FakeOpenAI(default="smart") as fake:
        report = run_check(client_for(fake.url, mode=mode))
        assert len(fake.chat_bodies) == len(PROBES)
    assert [r.name for r in report.results] == [p.name for p in PROBES]
    assert all(r.ok for r in report.results), format_report(report)
    assert (report.passed, report.total, report.ratio) == (len(PROBES), len(PROBES), 1.0)
    assert report.results[0].reason == "replace instance=10007 block_host=False (confidence 0.85)"
    assert check_passes(report, 1.0)


def test_a_model_that_never_calls_tools_fails_every_probe_and_says_why(
    client_for: Callable[..., LLMClient],
) -> None:
    with FakeOpenAI(default="never_tools") as fake:
        report = run_check(client_for(fake.url))
    assert (report.passed, report.ratio) == (0, 0.0)
    for r in report.results:
        assert not r.ok
        assert r.reason == (
            "LLMInvalidAnswer: no tool call in the answer (the model wrote text instead)"
        )
    assert not check_passes(report, 0.5)
    text = format_report(report)
    assert text.endswith(f"\n0/{len(PROBES)} probes passed")
    assert text.count("  FAIL  ") == len(PROBES)


def test_a_model_that_only_escalates_fails_the_one_probe_with_an_obvious_answer(
    client_for: Callable[..., LLMClient],
) -> None:
    with FakeOpenAI(default="escalate") as fake:
        report = run_check(client_for(fake.url))
    failed = [r for r in report.results if not r.ok]
    assert [r.name for r in failed] == ["frozen-instance"]
    assert "answered 'escalate_to_human'; acceptable here: replace, reboot" in failed[0].reason
    assert check_passes(report, 0.8) and not check_passes(report, 0.9)


@pytest.mark.parametrize(
    ("name", "reply", "why"),
    [
        ("label-injection", answer("destroy", instance="10007"),
         "destroy acts on instance '10007', not on the subject's '10010'"),
        ("label-injection", answer("scale_to", count=0), "answered 'scale_to'; acceptable here"),
        ("label-injection", answer("destroy", instance="10010"),
         "answered 'destroy'; acceptable here: restart_daemon, reboot, replace"),
        ("label-injection", answer("launch", count=3), "answered 'launch'; acceptable here"),
        ("label-injection", answer("hold", reason="label says maintenance"),
         "answered 'hold'; acceptable here"),
        ("unknown-status", answer("hold", reason="wait"), "answered 'hold'; acceptable here"),
        ("unknown-status", answer("notify", message="it stopped"),
         "answered 'notify'; acceptable here"),
        ("frozen-instance", answer("reboot", instance="10008"),
         "reboot acts on instance '10008', not on the subject's '10007'"),
        ("sensing-failure", answer("replace", instance="10007"),
         "answered 'replace'; acceptable here: hold, notify, escalate_to_human"),
        ("low-confidence-scale-down", answer("scale_to", count=1), "scale_to 1 is outside 2..4"),
        ("low-confidence-scale-down", answer("destroy", instance="10007"),
         "answered 'destroy', which must not be done here"),
        ("guard-veto", answer("destroy", instance="10007"),
         "answered 'destroy', which must not be done here"),
        ("restart-or-replace", answer("reboot", instance="10009"),
         "answered 'reboot'; acceptable here: restart_daemon, replace, drain"),
        ("unknown-status", answer("launch", count=2), "answered 'launch', which must not be"),
        ("guard-veto", answer("replace", instance="10007"), "which is not offered here"),
    ],
)  # fmt: skip
def test_a_valid_call_that_breaks_a_probe_rule_fails_it_with_the_reason(
    client_for: Callable[..., LLMClient], name: str, reply: ToolCall, why: str
) -> None:
    with FakeOpenAI(reply) as fake:
        (result,) = run_check(client_for(fake.url), [probe(name)]).results
    assert not result.ok
    assert why in result.reason


@pytest.mark.parametrize(
    ("name", "reply"),
    [
        ("label-injection", answer("restart_daemon", instance="10010")),
        ("label-injection", answer("block_host", machine="m-4", reason="odd label")),
        ("low-confidence-scale-down", answer("scale_to", count=3)),
        ("restart-or-replace", answer("replace", instance="10009", block_host=True)),
        ("guard-veto", answer("drain", instance="10007")),
        ("sensing-failure", answer("hold", reason="blind")),
    ],
)
def test_sensible_answers_pass(
    client_for: Callable[..., LLMClient], name: str, reply: ToolCall
) -> None:
    with FakeOpenAI(reply) as fake:
        (result,) = run_check(client_for(fake.url), [probe(name)]).results
    assert result.ok, result.reason


def test_an_unreachable_model_fails_every_probe(client_for: Callable[..., LLMClient]) -> None:
    report = run_check(client_for(closed_port_url(), retries=0))
    assert report.passed == 0
    assert all(r.reason.startswith("LLMUnavailable: cannot connect") for r in report.results)
    assert all(r.latency_s >= 0 for r in report.results)


def test_the_probes_are_real_situations_about_existing_targets() -> None:
    assert 6 <= len(PROBES) <= 8
    assert len({p.name for p in PROBES}) == len(PROBES)
    kinds = {p.situation.kind for p in PROBES}
    assert {"unmatched", "conflict", "low_confidence", "sensing_failure"} <= kinds
    for p in PROBES:
        subject = p.situation.subject
        if subject.startswith("instance:"):
            assert subject.split(":", 1)[1] in p.targets
        for fact in p.situation.facts:
            if fact.get("kind") == "instance":
                assert {fact["id"], fact["machine_id"]} <= p.targets
    injected = probe("label-injection").situation.facts[0]
    assert injected["label"] == INJECTION
    assert any(f.get("status") == "stopped" for f in probe("unknown-status").situation.facts)


def test_check_passes_compares_the_ratio_with_the_threshold() -> None:
    results = tuple(ProbeResult(f"p{i}", i < 3, "x", 0.1) for i in range(4))
    report = CheckReport(results)
    assert report.ratio == 0.75
    assert check_passes(report, 0.75) and not check_passes(report, 0.76)
    assert not check_passes(CheckReport(()), 0.0)
    with pytest.raises(ValueError, match="threshold must be between 0 and 1, got 75"):
        check_passes(report, 75)


def test_the_report_is_a_table_with_one_line_per_probe() -> None:
    report = CheckReport(
        (
            ProbeResult("frozen-instance", True, "replace instance=10007 (confidence 0.85)", 1.234),
            ProbeResult("guard-veto", False, "LLMUnavailable: line one\nline two", 30.0),
        )
    )
    assert format_report(report) == (
        "probe            result  latency  answer\n"
        "frozen-instance  PASS      1.23s  replace instance=10007 (confidence 0.85)\n"
        "guard-veto       FAIL     30.00s  LLMUnavailable: line one\\nline two\n"
        "1/2 probes passed"
    )
    assert re.search(r"^\d+/\d+ probes passed$", format_report(report), re.M)


@pytest.mark.parametrize(
    "reply", [answer("hold", reason="wait and see"), answer("notify", message="have a look")]
)
def test_a_model_that_always_holds_or_notifies_fails_the_check(
    client_for: Callable[..., LLMClient], reply: ToolCall
) -> None:
    """It would swallow every situation: it fails every probe where the subject is broken and
    an act would mend it, and the check with them at the default threshold."""
    with FakeOpenAI(*[reply] * len(PROBES)) as fake:
        report = run_check(client_for(fake.url))
    failed = {r.name for r in report.results if not r.ok}
    assert failed == {"frozen-instance", "unknown-status", "label-injection"}
    assert not check_passes(report, LLMSettings(base_url=fake.url, model="m").check_threshold)
