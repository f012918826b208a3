"""The escalation outbox end to end on the simulator, with the worker off the tick as in
`fleetgate run` and `fleetgate tick` on a real fleet: an LLM and a mail server that hang never
delay a tick, and what they held back goes out once they answer; jobs survive a restart; an
escalation answered before its job runs pages nobody; failed deliveries are retried with a
backoff, a bounded number of times; a step or a shutdown lets a hung job go; an LLM answer the
guards refuse is not cleared before people hear of it."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from email import message_from_bytes, policy
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from aiosmtpd.controller import Controller as SMTPServer
from aiosmtpd.smtp import SMTP, Envelope, Session
from fakes.openai_server import FakeOpenAI
from fakes.silent import Silent
from support import ASK_ABOUT_THE_FLEET, NO_FAULTS_YAML, first_escalation

from controller.service.app import App
from controller.service.assemble import assemble
from controller.service.config import Config, parse_config
from controller.service.schedule import Runner
from escalation.channels.base import ChannelError
from escalation.outbox import Outbox

ROOT = Path(__file__).resolve().parents[2]
ASKS = ASK_ABOUT_THE_FLEET
FAULTS = NO_FAULTS_YAML


def config(tmp_path: Path, escalation: str = "") -> Config:
    """The simulator without faults; people answer within ten days; `escalation` adds keys (a
    file channel unless it names its own)."""
    channels = "" if "channels:" in escalation else "  channels: [file]\n"
    text = (f"interval_s: 0.05\nsim: {{world: {{{FAULTS}}}}}\n"
            f"escalation:\n  deadline_s: 864000\n{channels}{escalation}")  # fmt: skip
    return parse_config(str(tmp_path / "test.yaml"), text)


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[[Config], App]]:
    """An app on the simulator whose outbox is worked off the tick, as on a real fleet."""
    apps: list[App] = []
    asks = tmp_path / "asks.yaml"
    asks.write_text(ASKS)

    def build(cfg: Config) -> App:
        app = assemble(cfg, state=tmp_path / "state", clock=time.time, sleep=time.sleep, seed=7,
                       rules=[str(ROOT / "rules"), str(asks)])  # fmt: skip
        app.controller.escalator.after_write = None  # the simulator's own: in the tick
        apps.append(app)
        return app

    yield build
    for app in apps:
        app.close()


def wait_for(done: Callable[[], Any], within_s: float = 30.0) -> None:
    deadline = time.monotonic() + within_s
    while not done():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.05)


def raised(app: App) -> dict[str, Any]:
    """Tick until the fleet question is raised; its escalation."""
    return first_escalation(app, "requested", ticks=20)


def filed(app: App) -> str:
    path = app.state / "escalations.jsonl"
    return path.read_text() if path.exists() else ""


@dataclass
class Mailbox:
    """aiosmtpd's handler: keeps every message it accepts."""

    messages: list[Any] = field(default_factory=list)

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        assert isinstance(envelope.content, bytes)
        self.messages.append(message_from_bytes(envelope.content, policy=policy.default))
        return "250 OK"


@pytest.fixture
def mailbox() -> Iterator[tuple[Mailbox, int]]:
    box = Mailbox()
    with socket.socket() as s:  # a free port (aiosmtpd checks the one it is given)
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    server = SMTPServer(box, hostname="127.0.0.1", port=port)
    server.start()
    try:
        yield box, port
    finally:
        server.stop()


@dataclass
class Pager:
    """A channel that keeps open alerts, as PagerDuty does; fails its first `fail` sends."""

    name: str = "pager"
    fail: int = 0
    sent: list[int] = field(default_factory=list)
    resolved: list[int] = field(default_factory=list)

    def send(self, esc: dict[str, Any], text: str) -> None:
        if self.fail > 0:
            self.fail -= 1
            raise ChannelError(f"channel {self.name!r}: escalation {esc['id']!r}: HTTP 503")
        self.sent.append(int(esc["id"]))

    def resolve(self, esc: dict[str, Any]) -> None:
        self.resolved.append(int(esc["id"]))


def test_a_hung_llm_and_mail_server_never_delay_a_tick_and_the_mail_goes_out_once_they_answer(
    make: Callable[[Config], App], tmp_path: Path, mailbox: tuple[Mailbox, int]
) -> None:
    box, smtp_port = mailbox
    with Silent() as llm, Silent() as mail, FakeOpenAI() as model:
        app = make(config(tmp_path, (
            f"  llm: {{base_url: 'http://127.0.0.1:{llm.port}/v1', model: fake-model,\n"
            "         timeout_s: 60, retries: 0, require_check: false}\n"
            f"  channels: [{{type: email, host: 127.0.0.1, port: {mail.port}, security: none,\n"
            "               sender: fg@example.org, recipients: [ops@example.org],\n"
            "               timeout_s: 60, retries: 0}]\n"
        )))  # fmt: skip
        took: list[float] = []

        def tick() -> None:
            started = time.monotonic()
            app.controller.tick()
            took.append(time.monotonic() - started)

        def ticks_while_hanging() -> list[float]:
            """How long each tick took that ran in 3 s of silence (a tick that waited for the
            silence would not end in them at all)."""
            done = len(took)
            time.sleep(3.0)
            return took[done:]

        runner = Runner(tick, app.config.interval_s, outbox=app.outbox_thread())
        thread = threading.Thread(target=runner.run, name="ticks")
        thread.start()
        try:
            wait_for(lambda: llm.accepted >= 1)  # the worker asks the LLM, which says nothing
            [esc] = [e for e in app.journal.escalations.recent() if e["kind"] == "requested"]
            during = ticks_while_hanging()
            assert len(during) >= 3 and max(during) < 3.0  # the ticks kept their schedule
            assert not app.journal.llm.llm_calls(esc["id"])
            llm.answer_with(urlsplit(model.url).port or 0)  # the LLM answers at last
            wait_for(lambda: mail.accepted >= 1)  # ...and the mail server says nothing
            [call] = app.journal.llm.llm_calls(esc["id"])
            assert call["status"] == "ok" and call["routed"] == "people"
            during = ticks_while_hanging()
            assert len(during) >= 3 and max(during) < 3.0
            assert not app.journal.escalations.deliveries(esc["id"]) and not box.messages
            mail.answer_with(smtp_port)
            wait_for(lambda: box.messages)
            [msg] = box.messages
            assert f"#{esc['id']}" in msg["Subject"] and "Why you:" in msg.get_content()
            wait_for(lambda: app.journal.escalations.deliveries(esc["id"]))
            [d] = app.journal.escalations.deliveries(esc["id"])
            assert d["channel"] == "email" and d["ok"]
            [job] = app.controller.escalator.jobs.jobs(esc["id"])
            assert job["outcome"] == "delivered to 1 channel(s)" and job["attempts"] == 1
        finally:
            runner.stop.set()
            thread.join(timeout=30)
        assert not thread.is_alive() and runner.failed == 0


def test_a_job_written_before_a_restart_is_delivered_after_it(
    make: Callable[[Config], App], tmp_path: Path
) -> None:
    cfg = config(tmp_path)
    first = make(cfg)
    esc = raised(first)
    assert not first.journal.escalations.deliveries(esc["id"]) and not filed(first)
    first.close()  # the process stops before its worker got to the job
    again = make(cfg)
    assert again.outbox_step() == 1
    [d] = again.journal.escalations.deliveries(esc["id"])
    assert d["ok"] and f'"id": {esc["id"]}' in filed(again)
    [job] = again.controller.escalator.jobs.jobs(esc["id"])
    assert job["done_at"] is not None and job["outcome"] == "delivered to 1 channel(s)"


def test_an_escalation_resolved_before_its_job_runs_pages_nobody_but_is_resolved(
    make: Callable[[Config], App], tmp_path: Path
) -> None:
    app = make(config(tmp_path))
    pager = Pager()
    app.controller.escalator.notifier.channels.append(pager)
    esc = raised(app)
    now = app.controller.clock()
    assert app.journal.escalations.answer(esc["id"], status="resolved", by="controller", now=now,
                                          answer=None)  # fmt: skip
    app.controller.escalator.closed(esc["id"])
    assert app.outbox.work(now) == 2
    assert pager.sent == [] and not filed(app) and not app.journal.escalations.deliveries(esc["id"])
    read, resolve = app.controller.escalator.jobs.jobs(esc["id"])
    assert read["outcome"] == "not sent: the escalation is resolved"
    assert resolve["kind"] == "resolve" and resolve["outcome"] == "resolved on 1 channel(s)"
    assert pager.resolved == [esc["id"]]


def paging(app: App, *, fail: int) -> tuple[App, Pager, dict[str, Any], float]:
    """`app` with a pager that fails its first `fail` sends, one escalation raised, and now."""
    pager = Pager(fail=fail)
    app.controller.escalator.notifier.channels.append(pager)
    return app, pager, raised(app), app.controller.clock()


def test_a_failed_delivery_is_retried_with_backoff_on_that_channel_only_then_given_up(
    make: Callable[[Config], App], tmp_path: Path
) -> None:
    app, pager, esc, t = paging(make(config(tmp_path, "  outbox_attempts: 3\n"
                                            "  outbox_backoff_s: 10\n")), fail=99)  # fmt: skip
    jobs = app.controller.escalator.jobs
    assert app.outbox.work(t) == 1  # the file has it; the pager failed
    assert app.outbox.work(t + 9) == 0  # not due before the backoff
    assert app.outbox.work(t + 10) == 1
    assert app.outbox.work(t + 29) == 0  # the backoff doubled
    assert app.outbox.work(t + 30) == 1
    [job] = jobs.jobs(esc["id"])
    assert job["outcome"] == "failed after 3 tries" and "HTTP 503" in job["last_error"]
    assert job["sent"] == ["0:file"]
    rows = app.journal.escalations.deliveries(esc["id"])
    assert [(r["channel"], bool(r["ok"])) for r in rows] == [
        ("file", True), ("pager", False), ("pager", False), ("pager", False)]  # fmt: skip
    assert filed(app).count(f'"id": {esc["id"]}') == 1
    assert app.outbox.work(t + 9999) == 0  # given up: never taken again


def test_a_delivery_that_fails_once_goes_out_on_the_retry(
    make: Callable[[Config], App], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app, pager, esc, t = paging(make(config(tmp_path, "  outbox_backoff_s: 5\n")), fail=1)
    with caplog.at_level(logging.INFO, logger="escalation.notify"):
        app.outbox.work(t)
        app.outbox.work(t + 5)
    assert pager.sent == [esc["id"]]
    # the log says the escalation once, and the retry as one (it repeated the summary line)
    assert caplog.text.count(f"ESCALATION #{esc['id']} ") == 1, caplog.text
    assert f"escalation #{esc['id']}: sending again to 'pager'" in caplog.text
    [job] = app.controller.escalator.jobs.jobs(esc["id"])
    assert job["outcome"] == "delivered to 2 channel(s)" and job["attempts"] == 2


def silent_llm(port: int) -> str:
    """The escalation config lines of an LLM at `port` that is waited on for a minute."""
    return (f"  llm: {{base_url: 'http://127.0.0.1:{port}/v1', model: fake-model,\n"
            "         timeout_s: 60, retries: 0, require_check: false}\n")  # fmt: skip


def test_a_cron_step_is_bounded_and_what_the_llm_held_goes_to_people_next_time(
    make: Callable[[Config], App], tmp_path: Path
) -> None:
    with Silent() as llm:
        app = make(config(tmp_path, silent_llm(llm.port) + "  outbox_step_s: 1\n"))
        esc = raised(app)
        started = time.monotonic()
        app.outbox_step()  # as `fleetgate tick` does after its tick
        assert time.monotonic() - started < 10 and llm.accepted == 1
        [call] = app.journal.llm.llm_calls(esc["id"])
        assert call["status"] == "unavailable" and call["routed"] == "people"
        assert "outbox step of 1 s" in call["error"]
        [job] = app.controller.escalator.jobs.jobs(esc["id"], undone=True)
        assert job["taken_by"] is None and job["attempts"] == 1 and not job["routed"]["acted"]
        assert not filed(app)
        nxt = Outbox(app.controller.escalator)  # the next run's worker
        assert nxt.work(app.controller.clock()) == 1
        assert llm.accepted == 1 and f'"id": {esc["id"]}' in filed(app)  # not asked again
        assert "unavailable" in filed(app)  # people hear why it is theirs


def test_a_shutdown_lets_a_hung_job_go_within_its_grace(
    make: Callable[[Config], App], tmp_path: Path
) -> None:
    with Silent() as llm:
        app = make(config(tmp_path, silent_llm(llm.port)))
        worker = app.outbox_thread()
        assert worker is not None
        worker.grace_s = 0.5
        worker.start()
        esc = raised(app)  # the write wakes the worker, which asks the LLM
        wait_for(lambda: llm.accepted >= 1)
        started = time.monotonic()
        worker.stop()
        assert time.monotonic() - started < 5
        [job] = app.controller.escalator.jobs.jobs(esc["id"], undone=True)
        assert job["taken_by"] is None and "controller stopped" in job["last_error"]


def test_the_simulator_works_the_outbox_in_the_tick(tmp_path: Path) -> None:
    asks = tmp_path / "asks.yaml"
    asks.write_text(ASKS)
    app = assemble(config(tmp_path), state=tmp_path / "state", clock=time.time, sleep=time.sleep,
                   seed=7, rules=[str(ROOT / "rules"), str(asks)])  # fmt: skip
    try:
        assert app.outbox_thread() is None  # no thread: a replay is the same every run
        esc = raised(app)
        assert app.journal.escalations.deliveries(esc["id"])  # delivered before the tick ended
        assert not app.controller.escalator.jobs.jobs(undone=True)
    finally:
        app.close()


def test_an_llm_answer_the_guards_refuse_still_reaches_people_off_the_tick(
    make: Callable[[Config], App], tmp_path: Path
) -> None:
    app = make(config(tmp_path))
    j = app.journal
    answered = j.escalations.add_escalation(fingerprint="x", kind="unmatched", subject="fleet",
                                            summary="s", now=1.0, deadline=9e9, situation={},
                                            default_action={})  # fmt: skip
    j.escalations.answer(answered, status="approved", by="llm:m", now=2.0,
                         answer={"action": "launch", "params": {"count": 1}})  # fmt: skip
    j.meta.put("paused", True)  # the guards refuse every fleet change
    app.controller.tick()
    [refused] = [e for e in j.escalations.recent() if e["kind"] == "guard_veto"]
    assert refused["status"] == "pending"  # raised this tick: not cleared in it
    app.outbox.work(app.controller.clock())
    assert f'"id": {refused["id"]}' in filed(app)
    assert not j.llm.llm_calls(refused["id"])  # people decide, not the LLM again
