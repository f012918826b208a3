"""The email channel: one plain-text message per escalation over SMTP (smtplib).

The text comes from email.txt.j2: a `Subject: ` line (email_subject.txt.j2, `[fleetgate] #ID
KIND SUBJECT: SUMMARY`, capped), an empty line, then the body (message.txt.j2). Text without
the Subject line (the Notifier's built-in text when a template failed) is sent whole, under a
subject built here, so people still hear.

security: "tls" connects with TLS (SMTPS, port 465 unless given); "starttls" connects in plain
and must upgrade (587 unless given; a server that does not offer STARTTLS is an error, never a
silent downgrade); "none" sends in plain (a local relay; 587 unless given, as before the
port followed `security`).

A timeout bounds each reply, and one connection's whole exchange is bounded too
(EXCHANGE_TIMEOUTS timeouts): a server that trickles its replies is a transient failure.

Retried (the whole transaction, `retries` times, waiting backoff_s, 2*backoff_s, ...):
connection errors, timeouts, a dropped connection and transient 4xx replies. Any 5xx reply, a
TLS failure or a refused login is a ChannelError at once; a message some recipients refused
and others took is sent (a warning names the refused: retrying would send it to the others
again). The password never appears in a log line or an error, nor does its base64. Must NOT
render, retry for long or queue mail: a relay's job.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import smtplib
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from email.header import Header
from email.message import Message
from email.mime.text import MIMEText
from email.utils import formatdate, make_msgid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from controller.core.fields import Secret
from escalation.channels.base import ChannelError
from escalation.channels.http import scrub

log = logging.getLogger(__name__)
_LOOPBACK = ("127.0.0.1", "::1", "localhost")  # a relay on this machine: no wire to read
EXCHANGE_TIMEOUTS = 3  # one connection's whole exchange, in timeouts

Security = Literal["starttls", "tls", "none"]
# each security's port unless given: implicit TLS on 465; none keeps the 587 it always had, on
# which a relay that a config without `port` reached still listens
PORTS: dict[str, int] = {"tls": 465, "starttls": 587, "none": 587}
MAX_SUBJECT = 200


class _Transient(Exception):
    """A failure worth one more try (wraps the reason, already described)."""


def split_text(text: str, esc: dict[str, Any]) -> tuple[str, str]:
    """(subject, body) from the rendered email.txt.j2, or a built subject and the whole text."""
    first, _, rest = text.partition("\n")
    if first.startswith("Subject:"):
        subject, body = first[len("Subject:") :], rest.removeprefix("\n")
    else:
        subject = f"[fleetgate] #{esc.get('id')} {esc.get('kind')} {esc.get('subject')}"
        body = text
    return " ".join(subject.split())[:MAX_SUBJECT], body


def check_email(
    security: str,
    recipients: Sequence[str],
    timeout_s: float,
    retries: int,
    backoff_s: float,
    username: str | None,
    password: SecretStr | None,
) -> None:
    """ValueError unless these make a usable email channel (the settings' and the class's check)."""
    if security not in ("starttls", "tls", "none"):
        raise ValueError(f"email security must be starttls, tls or none, got {security!r}")
    if not recipients:
        raise ValueError("email needs at least one recipient")
    if retries < 0 or backoff_s < 0 or timeout_s <= 0:
        raise ValueError("email timeout_s must be > 0, retries and backoff_s >= 0")
    if (username is None) != (password is None):
        raise ValueError("email username and password go together: give both or neither")


class EmailSettings(BaseModel):
    """A `{type: email}` entry of `escalation.channels`."""

    model_config = ConfigDict(allow_inf_nan=False, extra="forbid", frozen=True, strict=True)

    type: Literal["email"] = "email"
    host: str = Field(min_length=1, description="the SMTP server")
    port: int | None = Field(
        None, gt=0, lt=65536, description="default: 465 for tls, 587 for starttls or none"
    )
    security: Security = "starttls"
    username: str | None = None
    password: Secret | None = None
    sender: str = Field(min_length=1)
    recipients: list[str]
    timeout_s: float = Field(10.0, description="per connection and reply")
    retries: int = Field(2, description="transactions after the first, on transient failures")
    backoff_s: float = Field(1.0, description="wait before the first retry, doubling")

    @model_validator(mode="after")
    def _usable(self) -> EmailSettings:
        check_email(
            self.security, self.recipients, self.timeout_s, self.retries, self.backoff_s,
            self.username, self.password,
        )  # fmt: skip
        return self

    def smtp_port(self) -> int:
        """`port`, else the usual port of `security` (TLS on 587 would meet a plain greeting)."""
        return self.port if self.port is not None else PORTS[self.security]


class EmailChannel:
    """Sends each escalation from `sender` to `recipients` through the SMTP server host:port."""

    template = "email.txt.j2"
    notice_template = "notice_email.txt.j2"

    def __init__(
        self,
        host: str,
        port: int,
        security: Security,
        username: str | None,
        password: SecretStr | None,
        sender: str,
        recipients: Sequence[str],
        timeout_s: float = 10.0,
        *,
        retries: int = 2,
        backoff_s: float = 1.0,
        ssl_context: ssl.SSLContext | None = None,
        name: str = "email",
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        check_email(security, recipients, timeout_s, retries, backoff_s, username, password)
        if security == "none" and username is not None and host not in _LOOPBACK:
            log.warning("email channel %r: security none sends the login (%s) in plain text "
                        "to %s; use starttls or tls", name, username, host)  # fmt: skip
        self.name = name
        self.host, self.port, self.security = host, port, security
        self.username, self._password = username, password
        self.sender, self.recipients = sender, list(recipients)
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        self._context = ssl_context
        self._sleep = sleep

    def __repr__(self) -> str:
        return f"EmailChannel(name={self.name!r}, host={self.host!r}, port={self.port!r})"

    def send(self, esc: dict[str, Any], text: str) -> None:
        where = f"channel {self.name!r}: escalation {esc.get('id')!r}: SMTP {self.host}:{self.port}"
        message = self.message(esc, text)
        for attempt in range(self.retries + 1):
            try:
                self._transaction(message, where)
                return
            except _Transient as exc:
                problem = self._scrub(str(exc))
            if attempt < self.retries:
                delay = self.backoff_s * 2.0**attempt
                log.warning("%s: %s; retry %d of %d in %gs", where, problem, attempt + 1,
                            self.retries, delay)  # fmt: skip
                self._sleep(delay)
        raise ChannelError(f"{where}: {problem} (gave up after {self.retries + 1} attempts)")

    def message(self, esc: dict[str, Any], text: str) -> Message:
        """The email for `esc`: subject and body from `text`, our headers.

        Built with the compat32 classes (MIMEText, Header): the newer EmailMessage folds long
        non-ASCII subjects wrongly (it splits words across encoded words, so readers see
        "lin e"); Header encodes whole words.
        """
        subject, body = split_text(text, esc)
        msg = MIMEText(body, "plain", "utf-8")
        msg["Subject"] = (
            subject
            if subject.isascii()
            else Header(subject, "utf-8", header_name="Subject").encode()
        )
        msg["From"] = self.sender
        msg["To"] = ", ".join(self.recipients)
        msg["Date"] = formatdate(usegmt=True)
        msg["Message-ID"] = make_msgid("fleetgate", self.sender.rpartition("@")[2] or None)
        msg["X-Fleetgate-Escalation"] = str(esc.get("id"))
        return msg

    def _transaction(self, message: Message, where: str) -> None:
        """One connection within EXCHANGE_TIMEOUTS timeouts in all (a timeout bounds each
        reply, and a server that sends its replies a few bytes at a time would hold the
        outbox as long as it likes): past it, the socket is shut and it is a transient."""
        smtp = self._unconnected()
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            sock = smtp.sock
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

        limit = EXCHANGE_TIMEOUTS * self.timeout_s
        timer = threading.Timer(limit, expire)
        timer.daemon = True
        timer.start()
        try:
            self._exchange(smtp, message, where)
        except (_Transient, ChannelError) as exc:
            if expired.is_set():
                raise _Transient(f"the exchange took over {limit:g} s") from exc
            raise
        finally:
            timer.cancel()

    def _exchange(self, smtp: smtplib.SMTP, message: Message, where: str) -> None:
        """Connect, TLS, login, send. _Transient to retry; ChannelError to give up."""
        try:
            with smtp:
                smtp.connect(self.host, self.port)
                if self.security == "starttls":
                    smtp.starttls(context=self._ssl_context())
                if self.username is not None and self._password is not None:
                    smtp.login(self.username, self._password.get_secret_value())
                refused = smtp.send_message(message, self.sender, self.recipients)
        except smtplib.SMTPRecipientsRefused as exc:
            reasons = {to: _reply(code, msg) for to, (code, msg) in exc.recipients.items()}
            if all(400 <= code < 500 for code, _ in exc.recipients.values()):
                raise _Transient(f"every recipient refused: {reasons}") from exc
            raise ChannelError(self._scrub(f"{where}: every recipient refused: {reasons}")) from exc
        except smtplib.SMTPResponseException as exc:
            problem = _reply(exc.smtp_code, exc.smtp_error)
            if 400 <= exc.smtp_code < 500:
                raise _Transient(problem) from exc
            raise ChannelError(self._scrub(f"{where}: {problem}")) from exc
        except smtplib.SMTPServerDisconnected as exc:
            raise _Transient(f"disconnected: {exc}") from exc
        except smtplib.SMTPException as exc:  # STARTTLS or AUTH not offered, no usable AUTH
            raise ChannelError(self._scrub(f"{where}: {type(exc).__name__}: {exc}")) from exc
        except ssl.SSLError as exc:
            raise ChannelError(f"{where}: TLS failed: {exc}") from exc
        except OSError as exc:  # refused, unreachable, timed out
            raise _Transient(f"cannot connect: {type(exc).__name__}: {exc}") from exc
        if refused:  # the others have it: failing would send it to them again on every retry
            reasons = {to: _reply(code, msg) for to, (code, msg) in refused.items()}
            log.warning("%s", self._scrub(f"{where}: sent, but refused for {reasons}"))

    def _unconnected(self) -> smtplib.SMTP:
        """The client, not yet connected (so that the watchdog holds it before the greeting is
        read). smtplib takes the name TLS checks the certificate against (`_host`) only from
        its constructor, which would connect at once: it is set here."""
        smtp = (smtplib.SMTP_SSL(timeout=self.timeout_s, context=self._ssl_context())
                if self.security == "tls" else smtplib.SMTP(timeout=self.timeout_s))  # fmt: skip
        smtp._host = self.host  # type: ignore[attr-defined]  # noqa: SLF001 - see the docstring
        return smtp

    def _ssl_context(self) -> ssl.SSLContext:
        return self._context or ssl.create_default_context()

    def _scrub(self, text: str) -> str:
        """`text` without the password, nor the base64 an AUTH exchange carries it in (a
        server may echo `AUTH PLAIN <base64>` in its refusal)."""
        if self._password is None:
            return text
        password = self._password.get_secret_value()
        user = self.username or ""
        forms = [
            password,
            *(
                base64.b64encode(raw.encode()).decode()
                for raw in (password, f"\0{user}\0{password}", f"{user}\0{user}\0{password}")
            ),
        ]
        return scrub(text, forms)


def _reply(code: int, msg: bytes | str) -> str:
    text = msg.decode("utf-8", errors="replace") if isinstance(msg, bytes) else str(msg)
    return f"{code} {' '.join(text.split())}"
