"""The LLM answer: parse a chat completion strictly and validate the action it names.

Pure: data in, a validated call or LLMInvalidAnswer out.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from controller.core.actions import ACTIONS, ActionError, validate
from escalation.llm_errors import LLMInvalidAnswer, LLMUnavailable
from escalation.llm_request import ESCALATE, RATIONALE_CAP, RAW_CAP
from escalation.situation import sanitize

log = logging.getLogger(__name__)

# How deep a chat completion may nest (its own is about 6 levels, an action's arguments 2 or 3
# more): JSON nested deeper is no answer, and past about 1,000 levels Python's parser and
# printer raise RecursionError, which no caller expects.
MAX_DEPTH = 32


def nested_deeper(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether `value` (decoded JSON) nests lists and objects more than `limit` levels deep;
    walked without recursion."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def loads(text: str | bytes) -> Any:
    """json.loads, with nesting past the parser's depth (RecursionError) or past MAX_DEPTH a
    ValueError like any other JSON that is no answer."""
    try:
        value = json.loads(text)
    except RecursionError as exc:
        raise ValueError("JSON nested too deeply to parse") from exc
    if nested_deeper(value):
        raise ValueError(f"JSON nested more than {MAX_DEPTH} levels deep")
    return value


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
            value = loads(value)
        except ValueError as exc:
            raise LLMInvalidAnswer(f"{what} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):  # some servers send tool arguments already decoded
        raise LLMInvalidAnswer(f"{what} is not a JSON object, got {type(value).__name__}")
    return value


def _decoded(arguments: Any) -> Any:
    """Arguments as JSON when they parse (so spacing does not tell two calls apart), else as is."""
    try:
        return loads(arguments) if isinstance(arguments, str) else arguments
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
    # text the model wrote (a notify's message, a reason) reaches people: one line, capped, as
    # the rationale is (it may carry what an instance wrote, and forge lines of a message)
    params = {k: sanitize(v.strip(), RATIONALE_CAP) if isinstance(v, str) else v
              for k, v in params.items()}  # fmt: skip
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
        json.dumps(calls, sort_keys=True, ensure_ascii=False)
        if calls
        else message.get("content") or message.get("refusal")
    )
    return str(text or "")[:RAW_CAP]


def _stopped_short(reply: dict[str, Any], message: dict[str, Any], max_tokens: int) -> str | None:
    """Why the endpoint says the answer is missing or incomplete, else None: the model refused
    (`refusal`), max_tokens ran out (finish_reason `length`; a reasoning model's thinking counts
    toward it), or a content filter withheld it (finish_reason `content_filter`)."""
    refusal = message.get("refusal")
    if isinstance(refusal, str) and refusal.strip():
        return f"the model refused: {sanitize(refusal.strip(), 200)!r}"
    finish = reply["choices"][0].get("finish_reason")  # _message found choices[0]
    if finish == "length":
        return (
            f"the answer was cut off at max_tokens={max_tokens} (finish_reason 'length'; a"
            " reasoning model's thinking counts toward it)"
        )
    if finish == "content_filter":
        return "the endpoint's content filter withheld the answer (finish_reason 'content_filter')"
    return None


MAX_TOKENS = 10**12  # a call's tokens as journaled: an integer any journal column holds


def _tokens(reply: dict[str, Any], messages: Sequence[dict[str, str]], raw: str) -> int:
    usage = reply.get("usage")
    total = usage.get("total_tokens") if isinstance(usage, dict) else None
    if isinstance(total, int) and not isinstance(total, bool) and total >= 0:
        return min(total, MAX_TOKENS)  # a claim past it spends the budget all the same
    # no usage reported: about 4 characters a token, of the prompt and of the whole reply (the
    # journal keeps `raw` capped; a reply of a megabyte spends its budget all the same)
    answer = max(len(raw), len(json.dumps(reply, ensure_ascii=False)))
    return max(1, (len(json.dumps(list(messages), ensure_ascii=False)) + answer) // 4)
