"""The closed action vocabulary: one typed parameter schema per action.

The same schemas validate rule `then` blocks, human answers and (later) the LLM's tool calls.
Pure: no I/O.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Launch(_Params):
    """Rent `count` new instances (offer filter from the config)."""

    count: int = Field(ge=1, le=1000)


class ScaleTo(_Params):
    """Grow the fleet to `count` live instances; shrinking is per idle instance (drain, destroy)."""

    count: int = Field(ge=0, le=100_000)


class OnInstance(_Params):
    instance: str = Field(min_length=1)


class Replace(OnInstance):
    """Launch a replacement now; destroy the old one once the new one runs (or at a deadline),
    at once if it serves nothing meanwhile."""

    block_host: bool = False
    reason: str = ""


class BlockHost(_Params):
    machine: str = Field(min_length=1)
    reason: str = ""
    for_s: float = Field(default=86_400, gt=0, alias="for")

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Notify(_Params):
    message: str = Field(min_length=1, max_length=2000)


class Reason(_Params):
    reason: str = Field(default="", max_length=2000)


ACTIONS: dict[str, type[_Params]] = {
    "launch": Launch,
    "scale_to": ScaleTo,
    "destroy": OnInstance,
    "replace": Replace,
    "drain": OnInstance,
    "restart_daemon": OnInstance,
    "reboot": OnInstance,
    "block_host": BlockHost,
    "notify": Notify,
    "escalate": Reason,
    "hold": Reason,
}

ActionName = Literal[
    "launch", "scale_to", "destroy", "replace", "drain", "restart_daemon", "reboot",
    "block_host", "notify", "escalate", "hold",
]  # fmt: skip

# Actions that remove capacity or work: held when sensing is in doubt, counted by the destroy cap.
DESTRUCTIVE = frozenset({"destroy", "replace", "reboot"})


class ActionError(ValueError):
    """An action name or its parameters are not valid."""


def validate(action: str, params: dict[str, Any]) -> dict[str, Any]:
    """Return `params` coerced to the action's schema, or raise ActionError in plain words."""
    schema = ACTIONS.get(action)
    if schema is None:
        raise ActionError(f"unknown action {action!r} (expected one of {', '.join(ACTIONS)})")
    try:
        model = schema.model_validate(params)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'params'}: {e['msg']}" for e in exc.errors()
        )
        raise ActionError(f"action {action!r}: {problems}") from exc
    return model.model_dump(by_alias=True)


def json_schema(action: str) -> dict[str, Any]:
    """The action's parameter schema as JSON Schema (for tool definitions)."""
    return ACTIONS[action].model_json_schema(by_alias=True)
