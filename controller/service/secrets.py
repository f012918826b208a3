"""Secrets named in the config: `{env: NAME}` or `{file: PATH}`, never the value itself.

Resolved once at start into `pydantic.SecretStr`, whose repr and str hide the value; a missing
variable or unreadable file is a config error naming the key and where it looked, never the
value. `Redactor` scrubs every resolved secret from log records as a last line of defence.
"""

from __future__ import annotations

import logging
import os
import shlex
from pathlib import Path

from pydantic import BaseModel, ConfigDict, SecretStr, model_validator

from controller import textfile


class SecretError(ValueError):
    """A secret could not be resolved."""


class SecretRef(BaseModel):
    """Where a secret lives: an environment variable or a file (first line, stripped)."""

    model_config = ConfigDict(allow_inf_nan=False, extra="forbid", frozen=True, strict=True)

    env: str | None = None
    file: str | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> SecretRef:
        if (self.env is None) == (self.file is None):
            raise ValueError("name exactly one of env: VARIABLE or file: PATH")
        return self

    def where(self) -> str:
        return f"environment variable {self.env}" if self.env else f"file {self.file}"

    def resolve(self, environ: dict[str, str] | None = None) -> SecretStr:
        env = os.environ if environ is None else environ
        if self.env is not None:
            value = env.get(self.env)
            if value is None:
                raise SecretError(f"environment variable {self.env} is not set")
            if not value.strip():  # `NAME=` left in an env file: it is there, and empty
                raise SecretError(f"environment variable {self.env} is empty")
            return _remember(value.strip(), self)
        try:
            text = textfile.read_text(str(self.file), limit=64 * 1024)
        except OSError as exc:
            why = textfile.unreadable(exc)
            raise SecretError(f"cannot read secret file {self.file}: {why}") from exc
        except UnicodeDecodeError as exc:
            why = f"not UTF-8 text ({exc.reason})"
            raise SecretError(f"cannot read secret file {self.file}: {why}") from exc
        value = text.strip().splitlines()[0].strip() if text.strip() else ""
        if not value:
            raise SecretError(f"secret file {self.file} is empty")
        return _remember(
            value, self.model_copy(update={"file": str(Path(str(self.file)).absolute())})
        )


class SourcedSecret(SecretStr):
    """A resolved secret that remembers where it was read (never the value: that is hidden)."""

    def __init__(self, value: str, ref: SecretRef | None = None) -> None:
        super().__init__(value)
        self.ref = ref


def in_shell(secret: SecretStr, default: str) -> str:
    """How a shell on this machine reads `secret` where it was read from, for a command printed
    for people to paste: `$NAME` for `{env: NAME}`, `$(head -n 1 PATH)` for `{file: PATH}`;
    `default` where that is not known. Never the value."""
    ref = getattr(secret, "ref", None)
    if not isinstance(ref, SecretRef):
        return default
    if ref.env is not None:
        return f"${{{ref.env}}}"
    return f"$(head -n 1 {shlex.quote(str(ref.file))})"


_KNOWN: set[str] = set()


def _remember(value: str, ref: SecretRef) -> SecretStr:
    if len(value) >= 4:
        _KNOWN.add(value)
    return SourcedSecret(value, ref)


def redact(text: str) -> str:
    for secret in _KNOWN:
        if secret in text:
            text = text.replace(secret, "[redacted]")
    return text


class Redactor(logging.Filter):
    """Replaces any resolved secret in a log record's message, and in its traceback (an
    exception's text may quote a URL or a header), with [redacted]."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _KNOWN:
            message = record.getMessage()
            clean = redact(message)
            if clean != message:
                record.msg, record.args = clean, None
            if record.exc_info and not record.exc_text:  # formatters use exc_text when set
                record.exc_text = logging.Formatter().formatException(record.exc_info)
            if record.exc_text:
                record.exc_text = redact(record.exc_text)
        return True
