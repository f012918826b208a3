"""Notifier: one rendering, every channel tried, every outcome reported and logged."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from escalation.channels.base import ChannelError
from escalation.channels.console import ConsoleChannel
from escalation.channels.file import FileChannel
from escalation.notify import Notifier
from escalation.render import Renderer


class Recorder:
    """A channel that keeps what it was sent."""

    def __init__(self, name: str = "recorder", template: str | None = None) -> None:
        self.name = name
        if template is not None:
            self.template = template
        self.sent: list[tuple[dict[str, Any], str]] = []

    def send(self, esc: dict[str, Any], text: str) -> None:
        self.sent.append((esc, text))


class Refuses:
    """A channel whose far end is down."""

    name = "down"

    def send(self, esc: dict[str, Any], text: str) -> None:
        raise ChannelError(f"channel {self.name!r}: connection refused")


class Buggy:
    """A channel with a bug in it."""

    name = "buggy"

    def send(self, esc: dict[str, Any], text: str) -> None:
        raise KeyError("oops")


class CountingRenderer(Renderer):
    def __init__(self, override_dir: Path | None = None) -> None:
        super().__init__(override_dir)
        self.calls: list[str] = []

    def render(self, name: str, /, **context: Any) -> str:
        self.calls.append(name)
        return super().render(name, **context)


def test_a_failing_channel_does_not_stop_the_others(
    esc: dict[str, Any], how: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    first, last = Recorder("first"), Recorder("last")
    notifier = Notifier([first, Refuses(), Buggy(), last], Renderer())
    with caplog.at_level(logging.INFO, logger="escalation.notify"):
        deliveries = notifier.deliver(esc, how)
    assert [(d.channel, d.ok) for d in deliveries] == [
        ("first", True),
        ("down", False),
        ("buggy", False),
        ("last", True),
    ]
    assert deliveries[1].detail == "channel 'down': connection refused"
    assert deliveries[2].detail == "KeyError: 'oops'"
    assert deliveries[0].detail == deliveries[3].detail == ""
    assert (
        first.sent[0][1] == last.sent[0][1] == Renderer().render("message.txt.j2", esc=esc, how=how)
    )
    log = caplog.text
    assert "ESCALATION #12 unmatched instance:10007:" in log
    assert "escalation #12: delivered via 'first'" in log
    assert "escalation #12: 'down': channel 'down': connection refused" in log
    assert "escalation #12: channel 'buggy' raised unexpectedly" in log


def test_the_message_is_rendered_once_for_all_channels(
    esc: dict[str, Any], how: dict[str, Any]
) -> None:
    renderer = CountingRenderer()
    Notifier([Recorder("a"), Recorder("b"), Recorder("c")], renderer).deliver(esc, how)
    assert renderer.calls.count("message.txt.j2") == 1


def test_a_channel_can_name_its_own_template(
    tmp_path: Path, esc: dict[str, Any], how: dict[str, Any]
) -> None:
    (tmp_path / "short.txt.j2").write_text("short #{{ esc.id }}")
    plain, short = Recorder("plain"), Recorder("short", template="short.txt.j2")
    Notifier([plain, short], Renderer(tmp_path)).deliver(esc, how)
    assert short.sent[0][1] == "short #12"
    assert plain.sent[0][1].startswith("ESCALATION #12: unmatched on instance:10007\n")


def test_a_broken_template_still_reaches_people(
    tmp_path: Path, esc: dict[str, Any], how: dict[str, Any]
) -> None:
    (tmp_path / "message.txt.j2").write_text("{{ esc.no_such_field }}")
    (tmp_path / "console_line.txt.j2").write_text("{{ nope }}")
    channel = Recorder()
    [delivery] = Notifier([channel], Renderer(tmp_path)).deliver(esc, how)
    assert delivery.ok
    assert "message.txt.j2" in delivery.detail and "no_such_field" in delivery.detail
    text = channel.sent[0][1]
    assert text.startswith("ESCALATION #12 unmatched instance:10007: Instance 10007 is frozen")
    assert "approve: fleetgate escalations approve 12\n" in text
    assert "deny: fleetgate escalations deny 12\n" in text
    assert "deadline: 2024-05-01T12:30:00Z, then: hold" in text


def test_console_and_file_channels_together(
    tmp_path: Path, esc: dict[str, Any], how: dict[str, Any]
) -> None:
    out = io.StringIO()
    path = tmp_path / "escalations.jsonl"
    deliveries = Notifier([ConsoleChannel(out), FileChannel(path)], Renderer()).deliver(esc, how)
    assert all(d.ok for d in deliveries)
    assert json.loads(path.read_text())["message"] == out.getvalue()
    assert "Deny:     fleetgate escalations deny 12" in out.getvalue()
