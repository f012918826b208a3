"""The LLM request: which actions are offered, as tools or a JSON schema, and the prompt.

Pure: builds data from a situation and the action vocabulary; no I/O.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from typing import Any

from controller.core.actions import DESCRIPTORS, json_schema
from escalation.llm_errors import LLMError
from escalation.render import Renderer, RenderError, to_json
from escalation.situation import Situation, sanitize, to_dict

log = logging.getLogger(__name__)

ESCALATE = "escalate_to_human"  # the model's way to hand a situation to people
SYSTEM_TEMPLATE = "prompt_system.txt.j2"
USER_TEMPLATE = "prompt_user.txt.j2"
MAX_WAIT_S = 30.0  # longest sleep between attempts, Retry-After included
PROMPT_TEXT_CAP = 500  # untrusted strings in the prompt (facts arrive already capped at 200)
RAW_CAP = 2000
RATIONALE_CAP = 1000
HOUR, DAY = 3600.0, 86_400.0

ESCALATE_HELP = "Hand the situation to a person. Use it whenever you are unsure."
_CONFIDENCE = {
    "type": "number",
    "minimum": 0,
    "maximum": 1,
    "description": "How sure you are that this is right, from 0 to 1.",
}
_RATIONALE = {"type": "string", "minLength": 1, "description": "Why, in one or two sentences."}


def offered_actions(situation: Situation) -> tuple[str, ...]:
    """The tools offered: the situation's allowed actions whose descriptors offer them to the
    LLM (a rule's `escalate` is not: the model has ESCALATE), then ESCALATE."""
    names = [
        a for a in situation.allowed_actions if a in DESCRIPTORS and DESCRIPTORS[a].offered_to_llm
    ]
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
    """What a tool does, in the model's words: its descriptor's summary."""
    return ESCALATE_HELP if name == ESCALATE else DESCRIPTORS[name].summary


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
