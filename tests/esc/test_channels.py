"""The console and file channels, through their public send()."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from escalation.channels.base import DEFAULT_TEMPLATE, Channel, ChannelError, template_for
from escalation.channels.console import ConsoleChannel
from escalation.channels.file import FileChannel

TEXT = "ESCALATION #12: unmatched on instance:10007\nline two\n"


def test_console_writes_the_message_to_the_given_stream(esc: dict[str, Any]) -> None:
    out = io.StringIO()
    ConsoleChannel(out).send(esc, TEXT)
    ConsoleChannel(out).send(esc, "no newline at the end")
    assert out.getvalue() == TEXT + "no newline at the end\n"


def test_console_uses_stdout_as_it_is_at_send_time(
    esc: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    channel = ConsoleChannel()
    later = io.StringIO()
    monkeypatch.setattr(sys, "stdout", later)
    channel.send(esc, TEXT)
    assert later.getvalue() == TEXT


def test_console_on_a_closed_stream_is_a_channel_error(esc: dict[str, Any]) -> None:
    out = io.StringIO()
    out.close()
    with pytest.raises(ChannelError, match=r"channel 'console': cannot write escalation 12"):
        ConsoleChannel(out).send(esc, TEXT)


def test_file_appends_one_json_line_per_escalation(tmp_path: Path, esc: dict[str, Any]) -> None:
    path = tmp_path / "deep" / "er" / "escalations.jsonl"  # parent folders are created
    channel = FileChannel(path)
    channel.send(esc, TEXT)
    channel.send({**esc, "id": 13}, "second\n")
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    assert first == {
        "id": 12,
        "kind": "unmatched",
        "subject": "instance:10007",
        "fingerprint": "1a2b3c4d5e6f7a8b",
        "summary": "Instance 10007 is frozen and no rule covers it.",
        "created_at": "2024-05-01T12:00:00Z",
        "deadline": "2024-05-01T12:30:00Z",
        "proposals": esc["proposals"],
        "default_action": {"action": "hold", "params": {"reason": "nobody answered"}},
        "message": TEXT,
    }
    assert (second["id"], second["message"]) == (13, "second\n")


def test_file_keeps_what_was_there(tmp_path: Path, esc: dict[str, Any]) -> None:
    path = tmp_path / "escalations.jsonl"
    path.write_text('{"id": 1}\n', encoding="utf-8")
    FileChannel(path).send(esc, TEXT)
    assert [json.loads(line)["id"] for line in path.read_text().splitlines()] == [1, 12]


def test_an_unwritable_file_path_is_a_channel_error_naming_it(
    tmp_path: Path, esc: dict[str, Any]
) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where a folder should be")
    path = blocker / "escalations.jsonl"
    with pytest.raises(ChannelError, match=r"channel 'file': cannot append escalation 12 to "):
        FileChannel(path).send(esc, TEXT)
    with pytest.raises(ChannelError, match=str(path)):
        FileChannel(path).send(esc, TEXT)
    with pytest.raises(ChannelError, match="cannot append"):
        FileChannel(tmp_path).send(esc, TEXT)  # a folder, not a file


def test_file_refuses_an_escalation_missing_fields(tmp_path: Path, esc: dict[str, Any]) -> None:
    del esc["deadline_iso"]
    path = tmp_path / "e.jsonl"
    with pytest.raises(ChannelError, match=r"lacks \['deadline_iso'\]"):
        FileChannel(path).send(esc, TEXT)
    assert not path.exists()


def test_channels_fit_the_protocol_and_name_their_template(tmp_path: Path) -> None:
    channels: list[Channel] = [ConsoleChannel(io.StringIO()), FileChannel(tmp_path / "e")]
    assert [c.name for c in channels] == ["console", "file"]
    assert {template_for(c) for c in channels} == {DEFAULT_TEMPLATE}

    class Slackish:
        name = "slack"
        template = "slack.json.j2"

        def send(self, esc: dict[str, Any], text: str) -> None:
            pass

    assert template_for(Slackish()) == "slack.json.j2"
