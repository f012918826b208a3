"""The LLM reader: one OpenAI-compatible chat completion per escalated situation, checked strictly.

The first reader of a situation the rules could not decide is a model behind any
`/v1/chat/completions` endpoint (vLLM, SGLang, llama.cpp server, Ollama, hosted APIs). It gets
the situation rendered from two templates and the allowed actions as tools (or as a JSON schema
for `response_format`), and must answer with exactly one allowed action with valid parameters,
a confidence and a rationale; anything else is an error, and the situation goes to people.

This module is shell: it does HTTP through one `requests.Session`, reads the injected clock and
sleeps through the injected `sleep`. It must NOT decide whether an answer may act (the router's
gate does), touch the fleet, or see a secret other than the API key it sends as a bearer header.

Errors:

    LLMError                  the prompt could not be rendered (a template problem)
     ├── LLMUnavailable       no answer: refused connection, timeout, HTTP 408/409/429/5xx after the
     │                        retries, another HTTP error, a body that is not a chat completion
     ├── LLMBudgetExceeded    the call or token budget is used up; nothing was sent
     └── LLMInvalidAnswer     the model answered, but not with one valid, allowed action
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol
from urllib.parse import urlsplit

import requests
from pydantic import BaseModel, ConfigDict, Field, field_validator

from controller.core.fields import Secret
from controller.fleet.retry import BodyError, read_body, retry_after
from escalation.channels.http import scrub
from escalation.llm_answer import (
    _check_call,
    _from_json,
    _from_tools,
    _message,
    _raw,
    _stopped_short,
    _tokens,
    loads,
)
from escalation.llm_errors import LLMBudgetExceeded, LLMError, LLMInvalidAnswer, LLMUnavailable
from escalation.llm_request import (
    DAY,
    ESCALATE,
    HOUR,
    MAX_WAIT_S,
    offered_actions,
    prompt_digest,
    render_prompt,
    response_format,
    tools,
)
from escalation.render import Renderer
from escalation.situation import Situation, sanitize

__all__ = [
    "ESCALATE", "MAX_WAIT_S", "LLMAnswer", "LLMBudgetExceeded", "LLMClient", "LLMError",
    "LLMInvalidAnswer", "LLMSettings", "LLMUnavailable", "MemoryUsage", "UsageStore",
    "offered_actions", "prompt_digest", "render_prompt", "response_format", "tools",
]  # fmt: skip

log = logging.getLogger(__name__)
MAX_REPLY_BYTES = 1 << 20  # a chat completion's reply is kilobytes; more is no answer


class LLMSettings(BaseModel):
    """How to reach the model and how much it may be used (the config's `escalation.llm`)."""

    model_config = ConfigDict(allow_inf_nan=False, extra="forbid", frozen=True, strict=True)

    base_url: str = Field(min_length=1)  # up to and including /v1: http://127.0.0.1:8000/v1
    model: str = Field(min_length=1)  # the served model's name
    api_key: Secret | None = None  # sent as a bearer header; never printed
    timeout_s: float = Field(default=30, gt=0)  # per HTTP attempt
    retries: int = Field(default=3, ge=0, le=10)  # attempts after the first
    backoff_s: float = Field(default=1.0, ge=0)  # doubled each retry, capped at MAX_WAIT_S
    mode: Literal["tools", "json_schema"] = "tools"
    max_calls_per_hour: int = Field(default=20, ge=0)
    max_tokens_per_day: int = Field(default=200_000, ge=0)
    temperature: float = Field(default=0.0, ge=0, le=2)
    max_tokens: int = Field(default=800, ge=1)  # of the answer
    # the request's name for max_tokens: OpenAI's reasoning models (o-series, gpt-5) refuse
    # `max_tokens` and take `max_completion_tokens`
    max_tokens_field: Literal["max_tokens", "max_completion_tokens"] = "max_tokens"
    # the service asks it only after `fleetgate llm-check` passed; unset: on whenever the
    # gate lets an answer act (mode `act`, or an action on `act`), off when it only proposes
    require_check: bool | None = None
    check_threshold: float = Field(default=0.8, ge=0, le=1)  # share of llm-check probes to pass

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if urlsplit(value).scheme not in ("http", "https") or not urlsplit(value).netloc:
            raise ValueError("expected an http:// or https:// URL ending in /v1")
        return value.rstrip("/")


class UsageStore(Protocol):
    """Where calls and tokens are counted for the budget (memory here, the journal in service)."""

    def record(self, at: float, tokens: int) -> None: ...
    def calls_since(self, t: float) -> int: ...
    def tokens_since(self, t: float) -> int: ...


@dataclass
class MemoryUsage:
    """A UsageStore in memory: (at, tokens) per call."""

    calls: list[tuple[float, int]] = field(default_factory=list)

    def record(self, at: float, tokens: int) -> None:
        self.calls.append((at, tokens))

    def calls_since(self, t: float) -> int:
        return sum(1 for at, _ in self.calls if at >= t)

    def tokens_since(self, t: float) -> int:
        return sum(tokens for at, tokens in self.calls if at >= t)


@dataclass(frozen=True)
class LLMAnswer:
    """One valid answer. `action is None` means the model chose escalate_to_human."""

    action: str | None
    params: dict[
        str, Any
    ]  # validated by controller.core.actions ({"reason"} for escalate_to_human)
    confidence: float
    rationale: str  # sanitized, capped at RATIONALE_CAP
    tokens: int
    latency_s: float
    prompt_digest: str  # sha256 hex of the exact messages sent
    raw: str  # the tool call(s) or content, capped at RAW_CAP


# ---- the client ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Retry:
    why: str
    retry_after: float | None = None
    cause: BaseException | None = None


class LLMClient:
    """Asks the configured model about one situation at a time."""

    def __init__(
        self,
        settings: LLMSettings,
        renderer: Renderer,
        usage: UsageStore,
        session: requests.Session | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.settings = settings
        self.model = settings.model
        self._renderer = renderer
        self._usage = usage
        self._own_session = session is None
        self._session = session if session is not None else requests.Session()
        self._clock = clock
        self._sleep = sleep
        parts = urlsplit(settings.base_url)  # shown in errors: no user info, no query
        self._where = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}"

    def close(self) -> None:
        """Close the HTTP session if this client opened it."""
        if self._own_session:
            self._session.close()

    def __enter__(self) -> LLMClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"LLMClient(model={self.model!r}, base_url={self._where!r})"

    def decide(self, situation: Situation, targets: Collection[str]) -> LLMAnswer:
        """Ask the model about `situation`; return its valid answer or raise an LLMError.

        1. check the budget: calls in the last hour, tokens in the last 24 hours;
        2. render the prompt (system and user templates, the situation as a dict);
        3. build the request: the offered actions as tools, or as a JSON schema;
        4. POST it with bearer auth and a timeout (redirects not followed: the prompt goes to
           the configured endpoint only; the reply read within the timeout and
           MAX_REPLY_BYTES), retrying 408, 409, 429, 5xx, timeouts and refused connections with
           capped exponential backoff (a Retry-After wins, in seconds or as a date; one past
           MAX_WAIT_S ends the tries);
        5. record the call and its tokens (reported, else estimated) in the usage store;
           a call that got no answer counts with 0 tokens;
        6. parse and validate the answer strictly: one tool call (or one JSON decision) naming
           an offered action with valid parameters on existing targets, a confidence in [0, 1]
           and a rationale; an invalid answer the endpoint marked as a refusal, as cut off at
           max_tokens or as filtered says so first.
        """
        now = self._clock()
        self._check_budget(now)
        messages = render_prompt(self._renderer, situation, self.settings.mode)
        offered = offered_actions(situation)
        body = self._request(messages, offered)
        reply, message = self._exchange(body, now)
        latency = self._clock() - now
        raw = _raw(message)
        tokens = _tokens(reply, messages, raw)
        self._usage.record(now, tokens)
        try:
            action, params, confidence, rationale = self._parse(reply, message, offered, targets)
        except LLMInvalidAnswer as exc:  # its words quote the answer: the key taken out too
            invalid = LLMInvalidAnswer(self._redact(str(exc)))
            invalid.raw = raw
            log.warning("llm %s on %r: invalid answer: %s", self.model, situation.subject,
                        invalid)  # fmt: skip
            raise invalid from None
        # the key escaped inside a tool call's arguments is found only once they are decoded
        rationale = self._redact(rationale)
        params = {k: self._redact(v) if isinstance(v, str) else v for k, v in params.items()}
        log.info(
            "llm %s on %r: %s (confidence %.2f, %d tokens, %.2fs)",
            self.model,
            situation.subject,
            action or ESCALATE,
            confidence,
            tokens,
            latency,
        )
        return LLMAnswer(
            action, params, confidence, rationale, tokens, latency, prompt_digest(messages), raw
        )

    def _check_budget(self, now: float) -> None:
        s = self.settings
        calls = self._usage.calls_since(now - HOUR)
        if calls >= s.max_calls_per_hour:
            raise LLMBudgetExceeded(
                f"LLM call budget used up: {calls} call{'s' if calls != 1 else ''} in the last hour"
                f" (max_calls_per_hour={s.max_calls_per_hour})"
            )
        tokens = self._usage.tokens_since(now - DAY)
        if tokens >= s.max_tokens_per_day:
            raise LLMBudgetExceeded(
                f"LLM token budget used up: {tokens} tokens in the last 24"
                f" hours (max_tokens_per_day={s.max_tokens_per_day})"
            )

    def _request(self, messages: list[dict[str, str]], offered: Sequence[str]) -> dict[str, Any]:
        s = self.settings
        body: dict[str, Any] = {
            "model": s.model,
            "messages": messages,
            "temperature": s.temperature,
            s.max_tokens_field: s.max_tokens,
        }
        if s.mode == "tools":
            body.update(tools=tools(offered), tool_choice="auto")
        else:
            body["response_format"] = response_format(offered)
        return body

    def _parse(
        self,
        reply: dict[str, Any],
        message: dict[str, Any],
        offered: Sequence[str],
        targets: Collection[str],
    ) -> tuple[str | None, dict[str, Any], float, str]:
        """The checked call; an invalid one says first why the endpoint stopped short, if it did."""
        try:
            call = _from_tools(message) if self.settings.mode == "tools" else _from_json(message)
            return _check_call(call, offered, targets)
        except LLMInvalidAnswer as exc:
            why = _stopped_short(reply, message, self.settings.max_tokens)
            if why is None:
                raise
            raise LLMInvalidAnswer(f"{why}; {exc}") from exc

    def _exchange(self, body: dict[str, Any], now: float) -> tuple[dict[str, Any], dict[str, Any]]:
        """The reply and its message; a call that got neither counts with 0 tokens."""
        try:
            reply = self._post(body)
            return reply, _message(reply)
        except LLMUnavailable:
            self._usage.record(now, 0)
            raise

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        attempts = self.settings.retries + 1
        for attempt in range(attempts):
            outcome = self._attempt(body)
            if not isinstance(outcome, _Retry):
                return outcome
            if attempt + 1 == attempts:
                raise LLMUnavailable(f"{outcome.why} (gave up after {attempts} attempts)") from (
                    outcome.cause
                )
            if outcome.retry_after is not None and outcome.retry_after > MAX_WAIT_S:
                raise LLMUnavailable(
                    f"{outcome.why} (it asks for {outcome.retry_after:g}s before another try,"
                    f" longer than the {MAX_WAIT_S:g}s fleetgate waits)"
                )
            wait = self._wait(attempt, outcome.retry_after)
            log.warning("llm %s: %s; retrying in %.1fs", self.model, outcome.why, wait)
            self._sleep(wait)
        raise AssertionError("unreachable")  # pragma: no cover

    def _attempt(self, body: dict[str, Any]) -> dict[str, Any] | _Retry:
        url = f"{self.settings.base_url}/chat/completions"
        try:
            resp = self._session.post(url, json=body, headers=self._headers(),
                                      timeout=self.settings.timeout_s, stream=True,
                                      allow_redirects=False)  # fmt: skip
            read_body(resp, limit=MAX_REPLY_BYTES, within_s=self.settings.timeout_s)
        except BodyError as exc:  # a trickle, or a flood
            return _Retry(f"the model at {self._where!r}: {exc}", cause=exc)
        except requests.Timeout as exc:
            why = f"the model at {self._where!r} did not answer within {self.settings.timeout_s}s"
            return _Retry(why, cause=exc)
        except requests.ConnectionError as exc:
            return _Retry(
                f"cannot connect to the model at {self._where!r}: {type(exc).__name__}", cause=exc
            )
        except requests.RequestException as exc:
            raise LLMUnavailable(
                f"the request to {self._where!r} failed: {self._redact(str(exc))}"
            ) from exc
        return self._reply(resp)

    def _reply(self, resp: requests.Response) -> dict[str, Any] | _Retry:
        status = f"the model at {self._where!r} answered HTTP {resp.status_code}"
        if resp.status_code in (408, 409, 429) or resp.status_code >= 500:
            return _Retry(f"{status}: {self._snippet(resp)}", retry_after(resp))
        if resp.status_code != 200:
            raise LLMUnavailable(f"{status}: {self._snippet(resp)}")
        try:  # what the model says reaches the journal and people: never the key it was sent
            reply = loads(self._redact(resp.content.decode("utf-8")))
        except ValueError as exc:
            raise LLMUnavailable(
                f"{status} with a body that is not JSON: {self._snippet(resp)}"
            ) from exc
        if not isinstance(reply, dict):
            raise LLMUnavailable(f"{status} with JSON that is not an object: {self._snippet(resp)}")
        if reply.get("error") and not reply.get("choices"):  # a failure after the 200 was sent
            raise LLMUnavailable(
                f"{status} with an error instead of an answer: {self._snippet(resp)}"
            )
        return reply

    def _wait(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, MAX_WAIT_S)
        return float(min(self.settings.backoff_s * 2**attempt, MAX_WAIT_S))

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.settings.api_key is not None:
            headers["Authorization"] = f"Bearer {self.settings.api_key.get_secret_value()}"
        return headers

    def _redact(self, text: str) -> str:
        """`text` without the API key, as sent or as an endpoint may echo it (JSON-escaped,
        percent-encoded)."""
        key = self.settings.api_key.get_secret_value() if self.settings.api_key else ""
        return scrub(text, [key]) if key else text

    def _snippet(self, resp: requests.Response) -> str:
        return repr(sanitize(self._redact(resp.text.strip()), 200))
