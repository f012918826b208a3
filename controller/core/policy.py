"""The decision settings: the gate, the guards and the values rules may read.

Pydantic models with `extra="forbid"`: an unknown key in the config is an error, not a no-op.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from controller.core.actions import ACTIONS, ActionName

Mode = Literal["observe", "propose", "act"]


class _Strict(BaseModel):
    # strict: YAML's `yes` is not a count, "5" is not a number
    model_config = ConfigDict(allow_inf_nan=False, extra="forbid", frozen=True, strict=True)


_DEFAULT_COOLDOWNS: dict[ActionName, float] = {
    "restart_daemon": 120.0, "reboot": 600.0, "drain": 60.0, "start": 600.0,
}  # fmt: skip


class Guards(_Strict):
    """Limits every plan passes, whoever proposed it."""

    min_instances: int = Field(0, ge=0, description="never destroy below this many live instances")
    max_instances: int = Field(30, ge=0, description="never launch above this many live instances")
    max_spend_per_hour: float = Field(30.0, ge=0, description="$/hour for the whole fleet")
    launch_dph_estimate: float = Field(
        0.90,
        gt=0,
        description="$/hour assumed for an instance not yet rented (the offer price cap)",
    )
    max_launches_per_hour: int = Field(30, ge=0)
    max_launches_per_tick: int = Field(6, ge=0)
    max_destroy_share_per_tick: float = Field(
        0.10, gt=0, le=1, description="share of the live fleet removed per tick (at least one)"
    )
    scale_down_delay_after_up_s: float = Field(
        600, ge=0, description="no idle scale-down for this long after a launch"
    )
    cooldowns_s: dict[ActionName, float] = Field(
        default_factory=lambda: _DEFAULT_COOLDOWNS.copy(),
        description="per action: seconds before the same action on the same target again",
    )
    crash_loop_limit: int = Field(
        3, ge=1, description="daemon restarts in an hour after which restarting is refused"
    )
    replace_deadline_s: float = Field(
        1800,
        gt=0,
        description="destroy the old instance this long after its replacement was "
        "launched, even if the replacement is not running yet",
    )
    launch_pending_s: float = Field(
        1800,
        gt=0,
        description="a launch not yet in the listing counts as capacity this long; "
        "after it, unconfirmed, it is recorded as lost",
    )
    launch_unknown_s: float = Field(
        300,
        gt=0,
        description="a launch whose create answered nothing clear (a 5xx, a timeout) counts as "
        "capacity until good listings taken this long after it still lack its label; then it "
        "is recorded as lost (vast lists a create within seconds)",
    )
    max_parked: int = Field(
        4, ge=0, description="never stop (park) an instance while this many are parked"
    )
    parked_dph_estimate: float = Field(
        0.10,
        ge=0,
        description="$/hour assumed for a parked instance's storage until the listing shows it",
    )
    cordon_settle_s: float = Field(
        35.0,
        ge=0,
        description="destroy or stop an instance fleetgate drained only this long after the "
        "drain: a Curio node reads its cordon (harmony_machines.unschedulable) with its task "
        "poll, every 30 s, and may claim a task until then",
    )
    paused: bool = Field(False, description="the pause switch: decide and record, act on nothing")


class Gate(_Strict):
    """How much the controller may do alone."""

    mode: Mode = "act"
    actions: dict[ActionName, Literal["act", "propose"]] = Field(
        default_factory=dict, description="per-action override of the global mode"
    )
    confidence_threshold: float = Field(0.8, ge=0, le=1)
    weak_evidence_factor: float = Field(
        0.5,
        gt=0,
        le=1,
        description="confidence multiplier while a sensor is stale (a failed "
        "sensor holds fleet changes instead)",
    )
    large_change_share: float = Field(
        0.25,
        gt=0,
        le=1,
        description="a plan removing more than this share of the fleet is doubtful",
    )
    large_change_factor: float = Field(0.7, gt=0, le=1)


class Autonomy(_Strict):
    """When the track record (`controller.core.track_record`) earns an action more autonomy,
    and how it loses it: promotions are suggested, demotions take effect at once."""

    promote_after: int = Field(5, ge=1, description="proposals approved unchanged in the window "
                               "(and none denied, changed or reverted) before fleetgate "
                               "suggests moving the action from propose to act")  # fmt: skip
    window_s: float = Field(7 * 86_400, gt=0, description="how far back the record looks")
    revert_window_s: float = Field(3600, gt=0, description="a person's opposite action this "
                                   "soon after an action reverts it")  # fmt: skip


def demoted(gate: Gate, actions: Iterable[str]) -> Gate:
    """`gate` with `actions` back on propose (the track record's demotions in force)."""
    down = {a: "propose" for a in sorted(set(actions)) if a in ACTIONS}
    if not down or gate.mode == "observe":
        return gate
    return gate.model_copy(update={"actions": {**gate.actions, **down}})


# the values rules read as `settings.NAME` when neither the config nor a rules file sets them
BUILTIN_VALUES: dict[str, Any] = {"tasks_per_instance": 2}


class DecideSettings(_Strict):
    gate: Gate = Gate()
    autonomy: Autonomy = Autonomy()
    guards: Guards = Guards()
    values: dict[str, Any] = Field(
        default_factory=lambda: dict(BUILTIN_VALUES),
        description="named values rules read as `settings.NAME`",
    )
