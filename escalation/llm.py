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
     ├── LLMUnavailable       no answer: refused connection, timeout, HTTP 429/5xx after the
     │                        retries, another HTTP error, a body that is not a chat completion
     ├── LLMBudgetExceeded    the call or token budget is used up; nothing was sent
     └── LLMInvalidAnswer     the model answered, but not with one valid, allowed action
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol
from urllib.parse import urlsplit

import requests
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from controller.actions import ACTIONS, ActionError, json_schema, validate
from escalation.render import Renderer, RenderError, to_json
from escalation.situation import Situation, sanitize, to_dict

log = logging.getLogger(__name__)

ESCALATE = "escalate_to_human"  # the model's way to hand a situation to people
NOT_OFFERED = frozenset({"escalate"})  # a rule's "escalate": the model has escalate_to_human
SYSTEM_TEMPLATE = "prompt_system.txt.j2"
USER_TEMPLATE = "prompt_user.txt.j2"
MAX_WAIT_S = 30.0  # longest sleep between attempts, Retry-After included
PROMPT_TEXT_CAP = 500  # untrusted strings in the prompt (facts arrive already capped at 200)
RAW_CAP = 2000
RATIONALE_CAP = 1000
HOUR, DAY = 3600.0, 86_400.0

# What each action does, in the model's words (tool descriptions and the prompt's action list).
HELP = {
    "launch": "Rent `count` new instances with the configured offer filter.",
    "scale_to": "Bring the fleet to `count` live instances (shrinking drains idle ones first).",
    "destroy": "Destroy one instance now; tasks still running on it are lost.",
    "replace": "Launch a replacement, then destroy this instance once the new one runs.",
    "drain": "Stop giving new tasks to an instance (Curio unschedulable).",
    "restart_daemon": "Restart the proving daemon (cuzk) on an instance.",
    "reboot": "Reboot an instance.",
    "block_host": "Stop renting a machine for `for` seconds.",
    "notify": "Send the operators a message; changes nothing.",
    "hold": "Change nothing for now.",
    ESCALATE: "Hand the situation to a person. Use it whenever you are unsure.",
}
_CONFIDENCE = {
    "type": "number",
    "minimum": 0,
    "maximum": 1,
    "description": "How sure you are that this is right, from 0 to 1.",
}
_RATIONALE = {"type": "string", "minLength": 1, "description": "Why, in one or two sentences."}


class LLMError(Exception):
    """The LLM gave no usable answer; the situation goes to people."""


class LLMUnavailable(LLMError):
    """No answer came back (network, timeout, HTTP error, not a chat completion)."""


class LLMBudgetExceeded(LLMError):
    """The calls-per-hour or tokens-per-day budget is used up; no request was sent."""


class LLMInvalidAnswer(LLMError):
    """The model answered, but not with exactly one valid, allowed action."""

    raw: str = ""  # what the model said (tool calls or content), capped; set by LLMClient


class LLMSettings(BaseModel):
    """How to reach the model and how much it may be used."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: str = Field(min_length=1)  # up to and including /v1: http://127.0.0.1:8000/v1
    model: str = Field(min_length=1)  # the served model's name
    api_key: SecretStr | None = None  # sent as a bearer header; never printed
    timeout_s: float = Field(default=30, gt=0)  # per HTTP attempt
    retries: int = Field(default=3, ge=0, le=10)  # attempts after the first
    backoff_s: float = Field(default=1.0, ge=0)  # doubled each retry, capped at MAX_WAIT_S
    mode: Literal["tools", "json_schema"] = "tools"
    max_calls_per_hour: int = Field(default=20, ge=0)
    max_tokens_per_day: int = Field(default=200_000, ge=0)
    temperature: float = Field(default=0.0, ge=0, le=2)
    max_tokens: int = Field(default=800, ge=1)  # of the answer

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
    params: dict[str, Any]  # validated by controller.actions ({"reason"} for escalate_to_human)
    confidence: float
    rationale: str  # sanitized, capped at RATIONALE_CAP
    tokens: int
    latency_s: float
    prompt_digest: str  # sha256 hex of the exact messages sent
    raw: str  # the tool call(s) or content, capped at RAW_CAP


# ---- the request ---------------------------------------------------------------------------


def offered_actions(situation: Situation) -> tuple[str, ...]:
    """The tools offered: the situation's allowed actions from the vocabulary, then ESCALATE."""
    names = [a for a in situation.allowed_actions if a in ACTIONS and a not in NOT_OFFERED]
    return (*dict.fromkeys(names), ESCALATE)


def params_schema(name: str) -> dict[str, Any]:
    """An action's parameters as JSON Schema, without pydantic's titles."""
    if name == ESCALATE:
        return {
            "type": "object",
            "additionalProperties": False,
            "required": ["reason"],
            "properties": {
                "reason": {"type": "string", "description": "What a person should look at."}
            },
        }
    schema = json_schema(name)
    props = {
        k: {n: v for n, v in p.items() if n != "title"} for k, p in schema["properties"].items()
    }
    return {
        "type": "object",
        "additionalProperties": False,
        "properties": props,
        "required": list(schema.get("required", [])),
    }


def describe(name: str) -> str:
    return HELP.get(name) or str(json_schema(name).get("description", name))


def tools(offered: Sequence[str]) -> list[dict[str, Any]]:
    """One function tool per offered action, each also requiring confidence and rationale."""
    out = []
    for name in offered:
        schema = params_schema(name)
        schema["properties"] = {
            **schema["properties"],
            "confidence": _CONFIDENCE,
            "rationale": _RATIONALE,
        }
        schema["required"] = [*schema["required"], "confidence", "rationale"]
        out.append(
            {
                "type": "function",
                "function": {"name": name, "description": describe(name), "parameters": schema},
            }
        )
    return out


def response_format(offered: Sequence[str]) -> dict[str, Any]:
    """The json_schema mode's `response_format`: one decision object."""
    schema = {
        "type": "object",
        "additionalProperties": False,
        "required": ["action", "params", "confidence", "rationale"],
        "properties": {
            "action": {"type": "string", "enum": list(offered)},
            "params": {"type": "object"},
            "confidence": _CONFIDENCE,
            "rationale": _RATIONALE,
        },
    }
    return {
        "type": "json_schema",
        "json_schema": {"name": "decision", "strict": True, "schema": schema},
    }


def render_prompt(
    renderer: Renderer, situation: Situation, mode: str = "tools"
) -> list[dict[str, str]]:
    """The system and user messages for `situation`: deterministic, built from no secret.

    Template context (both templates): `situation` (to_dict, every string sanitized and capped
    at PROMPT_TEXT_CAP), `actions` ([{name, description, parameters}], ESCALATE last), `mode`
    ("tools" or "json_schema"), `data_tag` (16 hex chars of the data's digest, which delimits
    the DATA block so a label cannot close it).
    """
    data = sanitize(to_dict(situation), PROMPT_TEXT_CAP)
    offered = offered_actions(situation)
    context = {
        "situation": data,
        "actions": [
            {"name": n, "description": describe(n), "parameters": params_schema(n)} for n in offered
        ],
        "mode": mode,
        "data_tag": hashlib.sha256(to_json(data).encode("utf-8")).hexdigest()[:16],
    }
    try:
        system = renderer.render(SYSTEM_TEMPLATE, **context)
        user = renderer.render(USER_TEMPLATE, **context)
    except RenderError as exc:
        raise LLMError(f"cannot render the LLM prompt: {exc}") from exc
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def prompt_digest(messages: Sequence[dict[str, str]]) -> str:
    canonical = json.dumps(
        list(messages), sort_keys=True, ensure_ascii=False, separators=(",", ":")
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


# ---- the answer ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Call:
    name: str
    args: dict[str, Any]


def _short(value: Any) -> str:
    """A value the model sent, for an error message: repr'd, escaped, capped."""
    return str(sanitize(repr(value), 80))


def _json_object(value: Any, what: str) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise LLMInvalidAnswer(f"{what} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):  # some servers send tool arguments already decoded
        raise LLMInvalidAnswer(f"{what} is not a JSON object, got {type(value).__name__}")
    return value


def _decoded(arguments: Any) -> Any:
    """Arguments as JSON when they parse (so spacing does not tell two calls apart), else as is."""
    try:
        return json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        return arguments


def _one_tool_call(message: dict[str, Any]) -> tuple[str, Any]:
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list) or not calls:
        said = " (the model wrote text instead)" if message.get("content") else ""
        raise LLMInvalidAnswer(f"no tool call in the answer{said}")
    found = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise LLMInvalidAnswer(f"a tool call without a function name: {_short(str(call))}")
        found.append((function["name"], function.get("arguments")))
    if len({json.dumps([n, _decoded(a)], sort_keys=True) for n, a in found}) > 1:
        names = ", ".join(_short(n) for n, _ in found)
        raise LLMInvalidAnswer(
            f"the model made {len(found)} different tool calls ({names}); exactly one is expected"
        )
    return found[0]


def _from_tools(message: dict[str, Any]) -> _Call:
    name, arguments = _one_tool_call(message)
    args = _json_object(arguments, f"the arguments of the {_short(name)} call")
    return _Call(name, args)


def _from_json(message: dict[str, Any]) -> _Call:
    if message.get("tool_calls"):
        raise LLMInvalidAnswer("the model made a tool call; a JSON decision was expected")
    doc = _json_object(message.get("content") or "", "the answer")
    keys = {"action", "params", "confidence", "rationale"}
    if set(doc) != keys:
        raise LLMInvalidAnswer(f"the answer's keys are {sorted(doc)!r}, expected {sorted(keys)!r}")
    action, params = doc["action"], doc["params"]
    if not isinstance(action, str) or not isinstance(params, dict):
        raise LLMInvalidAnswer("the answer's action must be a string and its params an object")
    if set(params) & {"confidence", "rationale"}:
        raise LLMInvalidAnswer("the answer's params must not hold confidence or rationale")
    return _Call(action, {**params, "confidence": doc["confidence"], "rationale": doc["rationale"]})


def _confidence(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise LLMInvalidAnswer(f"confidence must be a number from 0 to 1, got {_short(value)}")
    if not math.isfinite(value) or not 0 <= value <= 1:
        raise LLMInvalidAnswer(f"confidence {value!r} is outside 0..1")
    return float(value)


def _rationale(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise LLMInvalidAnswer(f"rationale must be a non-empty string, got {_short(value)}")
    return str(sanitize(value.strip(), RATIONALE_CAP))


def _params(name: str, params: dict[str, Any], targets: Collection[str]) -> dict[str, Any]:
    if name == ESCALATE:
        if set(params) - {"reason"} or not isinstance(params.get("reason", ""), str):
            raise LLMInvalidAnswer(
                f"escalate_to_human takes one string 'reason', got {_short(params)}"
            )
        return {"reason": sanitize(params.get("reason", ""), RATIONALE_CAP)}
    try:
        checked = validate(name, params)
    except ActionError as exc:
        raise LLMInvalidAnswer(f"the model's call is not valid: {exc}") from exc
    for key in ("instance", "machine"):
        if key in checked and checked[key] not in targets:
            raise LLMInvalidAnswer(
                f"the model named {key} {_short(checked[key])} which is not in this situation"
            )
    return checked


def _check_call(
    call: _Call, offered: Sequence[str], targets: Collection[str]
) -> tuple[str | None, dict[str, Any], float, str]:
    """(action or None for ESCALATE, params, confidence, rationale) from a call, or raise."""
    if call.name not in offered:
        known = "tool" if call.name in ACTIONS else "an unknown tool"
        not_here = ", which is not offered here" if call.name in ACTIONS else ""
        raise LLMInvalidAnswer(
            f"the model called {known} {_short(call.name)}{not_here}"
            f" (offered: {', '.join(offered)})"
        )
    args = dict(call.args)
    confidence = _confidence(args.pop("confidence", None))
    rationale = _rationale(args.pop("rationale", None))
    params = _params(call.name, args, targets)
    return (None if call.name == ESCALATE else call.name), params, confidence, rationale


def _message(reply: Any) -> dict[str, Any]:
    try:
        message = reply["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        message = None
    if not isinstance(message, dict):
        raise LLMUnavailable(
            "the endpoint's answer is not a chat completion (no choices[0].message)"
        )
    return message


def _raw(message: dict[str, Any]) -> str:
    calls = message.get("tool_calls")
    text = (
        json.dumps(calls, sort_keys=True, ensure_ascii=False) if calls else message.get("content")
    )
    return str(text or "")[:RAW_CAP]


def _tokens(reply: dict[str, Any], messages: Sequence[dict[str, str]], raw: str) -> int:
    usage = reply.get("usage")
    total = usage.get("total_tokens") if isinstance(usage, dict) else None
    if isinstance(total, int) and not isinstance(total, bool) and total >= 0:
        return total
    return max(1, (len(json.dumps(list(messages), ensure_ascii=False)) + len(raw)) // 4)


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
        4. POST it with bearer auth and a timeout, retrying 429, 5xx, timeouts and refused
           connections with capped exponential backoff (a numeric Retry-After wins);
        5. record the call and its tokens (reported, else estimated) in the usage store;
           a call that got no answer counts with 0 tokens;
        6. parse and validate the answer strictly: one tool call (or one JSON decision) naming
           an offered action with valid parameters on existing targets, a confidence in [0, 1]
           and a rationale.
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
            action, params, confidence, rationale = self._parse(message, offered, targets)
        except LLMInvalidAnswer as exc:
            exc.raw = raw
            log.warning("llm %s on %r: invalid answer: %s", self.model, situation.subject, exc)
            raise
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
                f"LLM call budget used up: {calls} calls in the last hour"
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
            "max_tokens": s.max_tokens,
        }
        if s.mode == "tools":
            body.update(tools=tools(offered), tool_choice="auto")
        else:
            body["response_format"] = response_format(offered)
        return body

    def _parse(
        self, message: dict[str, Any], offered: Sequence[str], targets: Collection[str]
    ) -> tuple[str | None, dict[str, Any], float, str]:
        call = _from_tools(message) if self.settings.mode == "tools" else _from_json(message)
        return _check_call(call, offered, targets)

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
            wait = self._wait(attempt, outcome.retry_after)
            log.warning("llm %s: %s; retrying in %.1fs", self.model, outcome.why, wait)
            self._sleep(wait)
        raise AssertionError("unreachable")  # pragma: no cover

    def _attempt(self, body: dict[str, Any]) -> dict[str, Any] | _Retry:
        url = f"{self.settings.base_url}/chat/completions"
        try:
            resp = self._session.post(
                url, json=body, headers=self._headers(), timeout=self.settings.timeout_s
            )
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
        if resp.status_code == 429 or resp.status_code >= 500:
            return _Retry(f"{status}: {self._snippet(resp)}", _retry_after(resp))
        if resp.status_code != 200:
            raise LLMUnavailable(f"{status}: {self._snippet(resp)}")
        try:
            reply = resp.json()
        except ValueError as exc:
            raise LLMUnavailable(
                f"{status} with a body that is not JSON: {self._snippet(resp)}"
            ) from exc
        if not isinstance(reply, dict):
            raise LLMUnavailable(f"{status} with JSON that is not an object: {self._snippet(resp)}")
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
        key = self.settings.api_key.get_secret_value() if self.settings.api_key else ""
        return text.replace(key, "***") if key else text

    def _snippet(self, resp: requests.Response) -> str:
        return repr(sanitize(self._redact(resp.text.strip()), 200))


def _retry_after(resp: requests.Response) -> float | None:
    """A numeric Retry-After header in seconds (an HTTP date is ignored: backoff applies)."""
    try:
        value = float(resp.headers.get("Retry-After", ""))
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None
