"""render.py and the packaged templates: determinism, strictness, overrides, message content."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from escalation.render import Renderer, RenderError, format_kv, format_value, iso8601

EXPECTED_ACTIONS_BLOCK = """\
Already done about instance:10007:
  - 2024-05-01T12:00:00Z reboot instance=10007 by rule:frozen-reboot: ok

Fleet:  running=10 frozen=1 spend_per_h=4.5 pending_tasks=30
Budget: spend_left_per_h=5.5 launches_left_1h=3

Proposed:
  1. replace_instance instance=10007 (by llm:qwen, confidence 0.42)
     why: frozen for 20 min after a reboot

Approve:  fleetgate escalations approve 12
Deny:     fleetgate escalations deny 12
Allowed actions: hold, reboot, replace_instance

Deadline: 2024-05-01T12:30:00Z. If nobody answers by then, the controller will:
  hold reason="nobody answered"
"""


def test_message_rendering_is_byte_for_byte_deterministic(
    esc: dict[str, Any], how: dict[str, Any]
) -> None:
    first = Renderer().render("message.txt.j2", esc=esc, how=how)
    again = Renderer().render("message.txt.j2", esc=esc, how=how)
    assert first.encode() == again.encode()
    assert first.startswith(
        "ESCALATION #12: unmatched on instance:10007\n"
        "Instance 10007 is frozen and no rule covers it.\n"
        "(fingerprint 1a2b3c4d5e6f7a8b, raised 2024-05-01T12:00:00Z)\n"
        "\n"
        "Evidence:\n"
        '  - type=instance id=10007 status=frozen label="fg a1"\n'
    )
    assert first.endswith(EXPECTED_ACTIONS_BLOCK)


def test_console_line_is_exactly_one_line(esc: dict[str, Any], how: dict[str, Any]) -> None:
    line = Renderer().render("console_line.txt.j2", esc=esc, how=how)
    assert line == (
        "ESCALATION #12 unmatched instance:10007: Instance 10007 is frozen and no rule covers"
        " it. — approve: fleetgate escalations approve 12 | deny: fleetgate escalations deny 12\n"
    )


def test_tojson_filter_sorts_keys(tmp_path: Path) -> None:
    (tmp_path / "j.j2").write_text("{{ d | tojson }}|{{ d | tojson(indent=1) }}")
    out = Renderer(tmp_path).render("j.j2", d={"b": 1, "a": {"z": "<&>", "y": 2}})
    assert out == (
        '{"a": {"y": 2, "z": "<&>"}, "b": 1}|{\n "a": {\n  "y": 2,\n  "z": "<&>"\n },\n "b": 1\n}'
    )


def test_a_missing_variable_is_a_render_error_naming_the_template(
    esc: dict[str, Any], how: dict[str, Any]
) -> None:
    with pytest.raises(RenderError, match=r"template 'message\.txt\.j2': 'how' is undefined"):
        Renderer().render("message.txt.j2", esc=esc)
    del esc["deadline_iso"]
    with pytest.raises(RenderError, match=r"message\.txt\.j2.*deadline_iso"):
        Renderer().render("message.txt.j2", esc=esc, how=how)


def test_a_missing_template_is_a_render_error() -> None:
    with pytest.raises(RenderError, match=r"template 'nope\.j2' not found"):
        Renderer().render("nope.j2")


def test_the_override_folder_wins_over_the_packaged_template(
    tmp_path: Path, esc: dict[str, Any], how: dict[str, Any]
) -> None:
    (tmp_path / "message.txt.j2").write_text("custom #{{ esc.id }} {{ how.deny_cli }}\n")
    renderer = Renderer(tmp_path)
    assert renderer.render("message.txt.j2", esc=esc, how=how) == (
        "custom #12 fleetgate escalations deny 12\n"
    )
    assert renderer.origin("message.txt.j2") == str(tmp_path / "message.txt.j2")
    # A template the folder does not have still comes from the package.
    assert renderer.render("console_line.txt.j2", esc=esc, how=how).startswith("ESCALATION #12")
    assert Renderer().origin("message.txt.j2").endswith("escalation/templates/message.txt.j2")


def test_an_override_folder_that_does_not_exist_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(RenderError, match="is not a directory"):
        Renderer(tmp_path / "missing")


def test_a_syntax_error_names_template_and_line(tmp_path: Path) -> None:
    (tmp_path / "bad.j2").write_text("line one\n{% if %}\n")
    with pytest.raises(RenderError, match=r"template 'bad\.j2': .*bad\.j2:2: "):
        Renderer(tmp_path).render("bad.j2")


def test_templates_are_sandboxed(tmp_path: Path) -> None:
    (tmp_path / "evil.j2").write_text("{{ ''.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(RenderError, match=r"evil\.j2"):
        Renderer(tmp_path).render("evil.j2")


# --- what the human message must say -------------------------------------------------------


def test_the_message_says_how_to_approve_deny_and_what_happens_at_the_deadline(
    esc: dict[str, Any], how: dict[str, Any]
) -> None:
    text = Renderer().render("message.txt.j2", esc=esc, how=how)
    assert "Approve:  fleetgate escalations approve 12\n" in text
    assert "Deny:     fleetgate escalations deny 12\n" in text
    assert "Deadline: 2024-05-01T12:30:00Z" in text
    assert 'the controller will:\n  hold reason="nobody answered"\n' in text
    assert "--action NAME" not in text  # there is a proposal to approve
    assert "http" not in text  # approve_http absent: not rendered
    assert len(text.splitlines()) <= 30


def test_without_a_proposal_the_message_shows_how_to_name_an_action(
    make_esc: Callable[..., dict[str, Any]], how: dict[str, Any]
) -> None:
    esc = make_esc(proposals=[], recent_actions=[])
    text = Renderer().render("message.txt.j2", esc=esc, how=how)
    assert "Proposed:\n  no proposal\n" in text
    assert "Already done about instance:10007:\n  nothing yet\n" in text
    assert "Approve:  fleetgate escalations approve 12 --action NAME\n" in text
    assert "Allowed actions: hold, reboot, replace_instance\n" in text
    line = Renderer().render("console_line.txt.j2", esc=esc, how=how)
    assert "approve: fleetgate escalations approve 12 --action NAME | deny:" in line


def test_the_http_way_to_approve_is_rendered_when_present(
    esc: dict[str, Any], how: dict[str, Any]
) -> None:
    how["approve_http"] = "curl -X POST http://127.0.0.1:8080/escalations/12/approve"
    text = Renderer().render("message.txt.j2", esc=esc, how=how)
    assert "      or  curl -X POST http://127.0.0.1:8080/escalations/12/approve\n" in text


def test_many_facts_are_capped_with_a_count(
    make_esc: Callable[..., dict[str, Any]], how: dict[str, Any]
) -> None:
    facts = [{"id": str(i), "status": "exited"} for i in range(13)]
    text = Renderer().render("message.txt.j2", esc=make_esc(facts=facts), how=how)
    assert "  - id=9 status=exited\n  ... and 3 more\n" in text
    assert "id=10 " not in text


def test_several_proposals_are_numbered_and_the_choice_explained(
    make_esc: Callable[..., dict[str, Any]], how: dict[str, Any]
) -> None:
    proposals = [
        {
            "action": "reboot",
            "params": {"instance": "7"},
            "proposer": "rule:a",
            "confidence": 0.5,
            "reason": "one",
        },
        {
            "action": "destroy",
            "params": {},
            "proposer": "human:ana",
            "confidence": None,
            "reason": "two",
        },
    ]
    text = Renderer().render("message.txt.j2", esc=make_esc(proposals=proposals), how=how)
    assert "  1. reboot instance=7 (by rule:a, confidence 0.50)\n     why: one\n" in text
    assert "  2. destroy (by human:ana)\n     why: two\n" in text
    assert "(approves proposal 1; add --action NAME to approve another)" in text


# --- filters -------------------------------------------------------------------------------


def test_kv_writes_bare_words_and_quotes_the_rest() -> None:
    assert format_kv({"id": "10007", "label": "fg a1", "n": 2, "ok": True, "x": None}) == (
        'id=10007 label="fg a1" n=2 ok=true x=null'
    )
    # a fact read back from the journal has its keys sorted: what it is still comes first
    read_back = {"age_s": 5, "daemon": "down", "id": "10007", "kind": "instance", "label": "x"}
    assert format_kv(read_back) == "kind=instance id=10007 label=x age_s=5 daemon=down"
    assert format_value({"b": 1, "a": [1, 2]}) == '{"a":[1,2],"b":1}'
    assert format_value('say "hi"') == '"say \\"hi\\""'
    assert format_value("") == '""'


def test_iso_formats_epoch_seconds_in_utc() -> None:
    assert iso8601(0) == "1970-01-01T00:00:00Z"
    assert iso8601(1714564800.9) == "2024-05-01T12:00:00Z"
    assert iso8601("already text") == "already text"
    with pytest.raises(TypeError):
        iso8601(None)  # type: ignore[arg-type]


def test_a_fleet_and_budget_nothing_sensed_are_said_to_be_unknown(
    make_esc: Callable[..., dict[str, Any]], how: dict[str, Any]
) -> None:
    """A tick that failed before sensing (ticks failing in a row) escalates with no fleet and
    no budget: every channel says they are not known instead of printing an empty value."""
    import json

    esc = make_esc(fleet={}, budget={})
    r = Renderer()
    unknown = "not known (not sensed this tick)"
    text = r.render("message.txt.j2", esc=esc, how=how)
    assert f"Fleet:  {unknown}\nBudget: {unknown}\n" in text
    slack = json.loads(r.render("slack.json.j2", esc=esc, how=how))
    head = slack["blocks"][1]["text"]["text"]
    assert f"*Fleet:* {unknown}\n*Budget left:* {unknown}\n" in head and "``" not in head
    ntfy = json.loads(r.render("ntfy.json.j2", esc=esc, how=how))
    assert f"Budget left: {unknown}\n" in ntfy["message"]
    shown = make_esc()  # a fleet sensed is shown as before
    assert "Fleet:  " + format_kv(shown["fleet"]) + "\n" in r.render(
        "message.txt.j2", esc=shown, how=how
    )


def test_a_situation_no_action_fits_prints_nothing_to_approve(
    esc: dict[str, Any], how: dict[str, Any]
) -> None:
    """A lost journal, a clock step, ticks failing: only hold and notify are allowed, so an
    `approve --action NAME` line invited an answer that could do nothing."""
    bare = {**esc, "proposals": [], "allowed_actions": ["hold", "notify"]}
    text = Renderer().render("message.txt.j2", esc=bare, how=how)
    assert "Approve:  nothing to approve: no action of fleetgate's fits" in text
    assert "--action NAME" not in text
    some = {**bare, "allowed_actions": ["hold", "notify", "reboot"]}
    text = Renderer().render("message.txt.j2", esc=some, how=how)
    assert f"Approve:  {how['approve_cli']} --action NAME" in text
