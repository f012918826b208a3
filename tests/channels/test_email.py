"""The email channel against a real SMTP server (aiosmtpd) on 127.0.0.1."""

from __future__ import annotations

import logging
import re
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from email import message_from_bytes, policy
from email.message import EmailMessage
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session
from pydantic import SecretStr

from controller.service.channels import CHANNELS, ChannelSeams
from escalation.channels.base import ChannelError
from escalation.channels.email import MAX_SUBJECT, EmailChannel, EmailSettings, Security
from escalation.render import Renderer

from .helpers import send

USER, PASSWORD = "fleetgate", "sm7p-pa55w0rd"


@dataclass
class Mailbox:
    """The SMTP server's handler: keeps accepted messages, answers DATA and RCPT as scripted."""

    data_replies: list[str] = field(default_factory=list)
    refuse: set[str] = field(default_factory=set)
    messages: list[tuple[Envelope, EmailMessage]] = field(default_factory=list)
    logins: list[str] = field(default_factory=list)

    async def handle_RCPT(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: Any
    ) -> str:
        if address in self.refuse:
            return "550 5.1.1 no such mailbox"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        reply = self.data_replies.pop(0) if self.data_replies else "250 OK"
        if reply.startswith("250"):
            assert isinstance(envelope.content, bytes)
            msg = message_from_bytes(envelope.content, policy=policy.default)
            assert isinstance(msg, EmailMessage)
            self.messages.append((envelope, msg))
        return reply

    def authenticate(
        self, server: SMTP, session: Session, envelope: Envelope, mechanism: str, data: Any
    ) -> AuthResult:
        assert isinstance(data, LoginPassword)
        self.logins.append(data.login.decode())
        ok = (data.login.decode(), data.password.decode()) == (USER, PASSWORD)
        return AuthResult(success=ok, handled=False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def mailbox() -> Iterator[tuple[Mailbox, int]]:
    box, port = Mailbox(), free_port()
    server = Controller(
        box, hostname="127.0.0.1", port=port, authenticator=box.authenticate,
        auth_require_tls=False,  # AUTH over plain text: fine on 127.0.0.1, in a test
    )  # fmt: skip
    server.start()
    try:
        yield box, port
    finally:
        server.stop()


def email(
    port: int,
    security: Security = "none",
    password: str | None = PASSWORD,
    recipients: tuple[str, ...] = ("ops@example.com", "oncall@example.com"),
    sleeps: list[float] | None = None,
) -> EmailChannel:
    return EmailChannel(
        "127.0.0.1", port, security, USER if password else None,
        SecretStr(password) if password else None, "fleetgate@example.com", recipients,
        timeout_s=5, retries=2, backoff_s=0.5, sleep=(sleeps if sleeps is not None else []).append,
    )  # fmt: skip


def test_the_message_arrives_with_subject_body_and_recipients(
    mailbox: tuple[Mailbox, int], esc: dict[str, Any], how: dict[str, Any]
) -> None:
    box, port = mailbox
    send(email(port), esc, how)
    [(envelope, msg)] = box.messages
    assert box.logins == [USER]
    assert envelope.mail_from == "fleetgate@example.com"
    assert envelope.rcpt_tos == ["ops@example.com", "oncall@example.com"]
    assert msg["Subject"] == (
        "[fleetgate] #12 unmatched instance:10007: Instance 10007 is frozen and no rule covers it."
    )
    assert msg["From"] == "fleetgate@example.com"
    assert msg["To"] == "ops@example.com, oncall@example.com"
    assert msg["X-Fleetgate-Escalation"] == "12"
    assert msg["Message-ID"].endswith("@example.com>")
    body = msg.get_content().replace("\r\n", "\n")
    assert body == Renderer().render("message.txt.j2", esc=esc, how=how)
    assert "Approve:  fleetgate escalations approve 12\n" in body
    assert "Deny:     fleetgate escalations deny 12\n" in body
    assert f"Deadline: {esc['deadline_iso']}" in body


def test_a_long_or_multiline_summary_makes_a_capped_one_line_subject(
    mailbox: tuple[Mailbox, int], make_esc: Any, how: dict[str, Any]
) -> None:
    box, port = mailbox
    send(email(port, password=None), make_esc(summary="line one\nline two é " * 40), how)
    [(_, msg)] = box.messages
    subject = msg["Subject"]
    assert subject.startswith("[fleetgate] #12 unmatched instance:10007: line one line two é")
    assert "\n" not in subject and len(subject) <= MAX_SUBJECT
    assert box.logins == []  # no username: no login


def test_the_notifiers_built_in_text_still_goes_out(
    mailbox: tuple[Mailbox, int], esc: dict[str, Any]
) -> None:
    box, port = mailbox
    email(port).send(esc, "ESCALATION #12 unmatched ...\n(the message template failed: x)\n")
    [(_, msg)] = box.messages
    assert msg["Subject"] == "[fleetgate] #12 unmatched instance:10007"
    assert msg.get_content().startswith("ESCALATION #12 unmatched ...\n(the message template")


def test_a_refused_login_is_a_channel_error_without_the_password(
    mailbox: tuple[Mailbox, int],
    esc: dict[str, Any],
    how: dict[str, Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    box, port = mailbox
    sleeps: list[float] = []
    with caplog.at_level(logging.DEBUG), pytest.raises(ChannelError, match=r" 535 ") as caught:
        send(email(port, password="wr0ng-pa55w0rd", sleeps=sleeps), esc, how)
    assert str(caught.value).startswith(
        f"channel 'email': escalation 12: SMTP 127.0.0.1:{port}: 535"
    )
    assert sleeps == [] and box.messages == []
    for text in (str(caught.value), caplog.text, repr(email(port))):
        assert "pa55w0rd" not in text


def test_a_transient_reply_is_retried(
    mailbox: tuple[Mailbox, int],
    esc: dict[str, Any],
    how: dict[str, Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    box, port = mailbox
    box.data_replies = ["451 4.3.0 try again later"]
    sleeps: list[float] = []
    with caplog.at_level(logging.WARNING, logger="escalation"):
        send(email(port, sleeps=sleeps), esc, how)
    assert len(box.messages) == 1 and sleeps == [0.5]
    assert "451 4.3.0 try again later; retry 1 of 2 in 0.5s" in caplog.text
    assert PASSWORD not in caplog.text


def test_transient_replies_to_the_end_give_up(
    mailbox: tuple[Mailbox, int], esc: dict[str, Any], how: dict[str, Any]
) -> None:
    box, port = mailbox
    box.data_replies = ["421 4.7.0 busy"] * 3
    sleeps: list[float] = []
    with pytest.raises(ChannelError, match=r"421 4\.7\.0 busy \(gave up after 3 attempts\)"):
        send(email(port, sleeps=sleeps), esc, how)
    assert sleeps == [0.5, 1.0] and box.messages == []


def test_a_permanent_reply_is_not_retried(
    mailbox: tuple[Mailbox, int], esc: dict[str, Any], how: dict[str, Any]
) -> None:
    box, port = mailbox
    box.data_replies = ["554 5.6.0 message refused"]
    sleeps: list[float] = []
    with pytest.raises(ChannelError, match=r"554 5\.6\.0 message refused"):
        send(email(port, sleeps=sleeps), esc, how)
    assert sleeps == []


def test_a_refused_recipient_is_a_warning_and_every_one_refused_an_error(
    mailbox: tuple[Mailbox, int], esc: dict[str, Any], how: dict[str, Any],
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """One refused, the other took it: an error made the outbox send it again, and the one
    who had it got a copy per retry."""
    box, port = mailbox
    box.refuse = {"oncall@example.com"}
    with caplog.at_level("WARNING", logger="escalation.channels.email"):
        send(email(port), esc, how)
    assert [m[0].rcpt_tos for m in box.messages] == [["ops@example.com"]]
    assert re.search(r"sent, but refused for .*oncall@example\.com.*550", caplog.text)
    with pytest.raises(ChannelError, match="every recipient refused"):
        send(email(port, recipients=("oncall@example.com",)), esc, how)


def test_starttls_that_the_server_does_not_offer_is_an_error_not_a_downgrade(
    mailbox: tuple[Mailbox, int], esc: dict[str, Any], how: dict[str, Any]
) -> None:
    box, port = mailbox
    with pytest.raises(ChannelError, match="STARTTLS extension not supported"):
        send(email(port, security="starttls"), esc, how)
    with pytest.raises(ChannelError, match="TLS failed"):
        send(email(port, security="tls"), esc, how)
    assert box.messages == [] and box.logins == []


def test_a_closed_port_is_a_channel_error_after_retries(
    esc: dict[str, Any], how: dict[str, Any]
) -> None:
    sleeps: list[float] = []
    with pytest.raises(ChannelError, match=r"cannot connect: ConnectionRefusedError") as caught:
        send(email(free_port(), sleeps=sleeps), esc, how)
    assert "gave up after 3 attempts" in str(caught.value) and sleeps == [0.5, 1.0]


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="at least one recipient"):
        EmailChannel("h", 25, "none", None, None, "a@b", [])
    with pytest.raises(ValueError, match="username and password go together"):
        EmailChannel("h", 25, "none", "u", None, "a@b", ["c@d"])
    with pytest.raises(ValueError, match="starttls, tls or none"):
        EmailChannel("h", 25, "ssl", None, None, "a@b", ["c@d"])  # type: ignore[arg-type]


def test_a_long_subject_is_cut_at_a_word_within_150_characters(
    mailbox: tuple[Mailbox, int], make_esc: Any, how: dict[str, Any]
) -> None:
    box, port = mailbox
    summary = " ".join(f"instance{n:05d}-frozen" for n in range(40))
    send(email(port, password=None), make_esc(summary=summary), how)
    [(_, msg)] = box.messages
    subject = msg["Subject"]
    assert len(subject) <= 150 and subject.endswith("-frozen…")  # a whole word, then the mark
    assert subject.removesuffix("…").split()[-1] in summary.split()


def test_a_refusal_that_echoes_the_login_shows_no_password_in_any_encoding() -> None:
    """A server may echo `AUTH PLAIN <base64 of \\0user\\0password>` in its 535 reply."""
    import base64

    channel = email(25)
    plain = base64.b64encode(f"\0{USER}\0{PASSWORD}".encode()).decode()
    login = base64.b64encode(PASSWORD.encode()).decode()
    text = channel._scrub(f"535 bad AUTH PLAIN {plain}; AUTH LOGIN {login}; {PASSWORD}")
    assert plain not in text and login not in text and PASSWORD not in text
    assert text == "535 bad AUTH PLAIN ***; AUTH LOGIN ***; ***"


def test_a_login_in_plain_text_to_another_host_is_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level("WARNING", logger="escalation.channels.email"):
        EmailChannel("smtp.example.com", 25, "none", USER, SecretStr(PASSWORD),
                     "fleetgate@example.com", ("ops@example.com",))  # fmt: skip
        EmailChannel("127.0.0.1", 25, "none", USER, SecretStr(PASSWORD),
                     "fleetgate@example.com", ("ops@example.com",))  # fmt: skip
    [warning] = [r.getMessage() for r in caplog.records]
    assert "sends the login" in warning and "smtp.example.com" in warning
    assert PASSWORD not in caplog.text


def test_a_server_that_trickles_its_replies_holds_the_channel_three_timeouts_at_most() -> None:
    """Each byte within the timeout: smtplib waited as long as the server liked (42 s for a
    2 s timeout), and the outbox with it."""
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def greet_slowly() -> None:
        conn, _ = listener.accept()
        with conn:
            for byte in b"220 mail.example.com ESMTP slow\r\n":
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return
                time.sleep(0.4)

    server = threading.Thread(target=greet_slowly, daemon=True)
    server.start()
    channel = EmailChannel("127.0.0.1", listener.getsockname()[1], "none", None, None,
                           "fleetgate@example.com", ("ops@example.com",), timeout_s=1.0,
                           retries=0)  # fmt: skip
    started = time.monotonic()
    try:
        with pytest.raises(ChannelError, match=r"the exchange took over 3 s \(gave up after 1"):
            channel.send({"id": 1}, "Subject: s\n\nbody")
        assert time.monotonic() - started < 8  # the greeting alone takes 14 s
    finally:
        listener.close()


@pytest.mark.parametrize(("security", "port", "expected"), [
    ("tls", None, 465), ("starttls", None, 587), ("none", None, 587), ("tls", 2465, 2465),
])  # fmt: skip
def test_the_port_follows_the_security_unless_given(
    security: str, port: int | None, expected: int, tmp_path: Any
) -> None:
    """`security: tls` alone used port 587, where a server greets in plain text (RFC 8314:
    implicit TLS is 465; smtplib.SMTP_SSL_PORT): every email failed its TLS handshake.
    `security: none` alone keeps port 587, which a relay that such a config reached listens on."""
    settings = EmailSettings.model_validate({
        "type": "email", "host": "smtp.example.org", "security": security, "sender": "a@b",
        "recipients": ["c@d"], **({"port": port} if port is not None else {}),
    })  # fmt: skip
    seams = ChannelSeams(state=tmp_path, file="e.jsonl", answer_token=None, clock=time.time,
                         sleep=lambda s: None)  # fmt: skip
    channel = CHANNELS["email"](settings, seams)
    assert isinstance(channel, EmailChannel) and channel.port == expected
