"""The closed action vocabulary: one descriptor per action.

A descriptor holds everything the controller knows about an action: its parameter schema
(which validates rule `then` blocks, human answers and the LLM's tool calls), whether it is
destructive, which failed sensors hold it, whether it runs while paused, whether an answer to an
escalation may name it, whether the LLM is offered it, and what carries it out. The guards, the
actuator, the LLM's tools and the README's action table read these; nothing else lists actions.
Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class _Params(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False, extra="forbid", frozen=True)


class Launch(_Params):
    """Rent `count` new instances (offer filter from the config)."""

    count: int = Field(ge=1, le=1000)


class ScaleTo(_Params):
    """Grow the fleet to `count` live instances; shrinking is per idle instance (drain, destroy).
    With `rent_to`, new rentals bring it to at most that many: the rest of `count` comes only
    from instances the plan undrains or starts (parked), which serve in minutes."""

    count: int = Field(ge=0, le=100_000)
    rent_to: int | None = Field(default=None, ge=0, le=100_000)


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
    # at most a 30-day block (`controller.core.track.BLOCK_MAX_S`): an answer cannot keep a
    # host out for decades
    for_s: float = Field(default=86_400, gt=0, le=30 * 86_400, alias="for")

    model_config = ConfigDict(
        allow_inf_nan=False, extra="forbid", frozen=True, populate_by_name=True
    )


class Notify(_Params):
    message: str = Field(min_length=1, max_length=2000)


class Reason(_Params):
    reason: str = Field(default="", max_length=2000)


Sensor = Literal["provider", "demand"]
# What carries an action out in controller.fleet.actuator: `launch` rents, `replace` rents a
# successor, `block_host` journals a host block, `provider_call` calls the provider's method of
# the action's name on its instance, `notify` tells the operators, `record` calls nothing.
Executor = Literal["launch", "replace", "block_host", "provider_call", "notify", "record"]


@dataclass(frozen=True)
class Descriptor:
    """One action of the vocabulary and the policy attached to it."""

    name: str
    params: type[_Params]
    summary: str
    """What it does, in plain words (the LLM's tool description and the README)."""
    executor: Executor | None
    """What carries it out; None: it never reaches the actuator (see `summary`)."""
    destructive: bool = False
    """It removes capacity or work: many at once on working instances lowers confidence."""
    held_on_sensing_failure: tuple[Sensor, ...] = ()
    """The sensors whose failure (or staleness) holds it in the guards."""
    pause_exempt: bool = False
    """It still runs while the controller is paused."""
    overridable: bool = True
    """An answer to an escalation (a person's or the LLM's) may name it, with parameters of
    its own; an answer naming an action that is not overridable is void."""
    offered_to_llm: bool = True
    """The LLM gets it as a tool when it reads a situation."""


_FLEET: tuple[Sensor, ...] = ("provider",)
_SCALING: tuple[Sensor, ...] = ("provider", "demand")

DESCRIPTORS: dict[str, Descriptor] = {d.name: d for d in (
    Descriptor("launch", Launch, "Rent `count` new instances with the configured offer filter.",
               "launch", held_on_sensing_failure=_FLEET),
    Descriptor("scale_to", ScaleTo, "Bring the fleet to `count` live instances (shrinking "
               "drains idle ones first); the guards turn it into the launches it implies. "
               "With `rent_to`, rent only up to that many; the rest of `count` only from "
               "undrained or started instances.",
               None, held_on_sensing_failure=_SCALING),
    Descriptor("destroy", OnInstance, "Destroy one instance now; tasks still running on it are "
               "lost (the guards drain a healthy one first).", "provider_call",
               destructive=True, held_on_sensing_failure=_SCALING),
    Descriptor("replace", Replace, "Launch a replacement; this instance is destroyed once the "
               "new one runs, or at once if it serves nothing meanwhile.", "replace",
               destructive=True, held_on_sensing_failure=_FLEET),
    Descriptor("drain", OnInstance, "Stop giving new tasks to an instance (Curio "
               "unschedulable).", "provider_call", held_on_sensing_failure=_FLEET),
    Descriptor("undrain", OnInstance, "Give a drained instance new tasks again (clear Curio "
               "unschedulable); it counts as capacity again.", "provider_call",
               held_on_sensing_failure=_FLEET),
    Descriptor("stop", OnInstance, "Park an idle, drained instance: vast stops it, keeping "
               "its disk (image, proof parameters, benchmark) and billing only storage; the "
               "guards refuse one holding tasks.", "provider_call",
               held_on_sensing_failure=_SCALING),
    Descriptor("start", OnInstance, "Start a parked instance: it serves in minutes without a "
               "new boot, unless its host's GPUs were rented meanwhile (it waits, "
               "scheduling); counts as a launch for the caps.", "provider_call",
               held_on_sensing_failure=_FLEET),
    Descriptor("restart_daemon", OnInstance, "Restart the proving daemon (cuzk) on an "
               "instance.", "provider_call"),
    Descriptor("reboot", OnInstance, "Reboot an instance.", "provider_call", destructive=True,
               held_on_sensing_failure=_FLEET),
    Descriptor("block_host", BlockHost, "Stop renting a machine for `for` seconds.",
               "block_host"),
    Descriptor("notify", Notify, "Send the operators a message; changes nothing.", "notify",
               pause_exempt=True),
    Descriptor("escalate", Reason, "Ask a person: a `requested` escalation with the rule's "
               "reason and matched facts; nothing is acted on.", None, pause_exempt=True,
               overridable=False, offered_to_llm=False),
    Descriptor("hold", Reason, "Change nothing for now.", "record", pause_exempt=True),
)}  # fmt: skip

ACTIONS: dict[str, type[_Params]] = {name: d.params for name, d in DESCRIPTORS.items()}

ActionName = Literal[
    "launch", "scale_to", "destroy", "replace", "drain", "undrain", "stop", "start",
    "restart_daemon", "reboot",
    "block_host", "notify", "escalate", "hold",
]  # fmt: skip


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
    return model.model_dump(by_alias=True, exclude_none=True)  # an unset `rent_to` is absent


def json_schema(action: str) -> dict[str, Any]:
    """The action's parameter schema as JSON Schema (for tool definitions)."""
    return ACTIONS[action].model_json_schema(by_alias=True)


def descriptor(action: str) -> Descriptor:
    """The action's descriptor, or ActionError naming the vocabulary."""
    spec = DESCRIPTORS.get(action)
    if spec is None:
        raise ActionError(f"unknown action {action!r} (expected one of {', '.join(DESCRIPTORS)})")
    return spec


_COLUMNS = ("action", "parameters", "destructive", "held when these sensors fail",
            "runs while paused", "an answer may name it", "offered to the LLM", "carried out by",
            "what it does")  # fmt: skip


def table() -> str:
    """The descriptors as the Markdown table in the README (a test keeps the two equal)."""

    def yes(flag: bool) -> str:
        return "yes" if flag else "no"

    rows = [_COLUMNS, tuple("---" for _ in _COLUMNS)]
    for d in DESCRIPTORS.values():
        fields = d.params.model_fields
        params = [(f.alias or n) + ("" if f.is_required() else "?") for n, f in fields.items()]
        rows.append((
            f"`{d.name}`", ", ".join(params), yes(d.destructive),
            ", ".join(d.held_on_sensing_failure) or "none", yes(d.pause_exempt),
            yes(d.overridable), yes(d.offered_to_llm), f"`{d.executor}`" if d.executor else "—",
            d.summary,
        ))  # fmt: skip
    return "\n".join("| " + " | ".join(r) + " |" for r in rows) + "\n"
