"""vast.ai's instance objects read as the controller's `Instance`, strictly.

`to_instance` maps vast's fields only: `stage` is "provisioning" while vast boots the container
and "registered" after, a placeholder that the controller overlays with its lifecycle records,
and `daemon`/`sidecar` are "unknown" until the controller's health checks fill them in. A field
of the wrong type is a SensorError naming the instance and the field: a listing vast garbled is
never read as a fleet. `number` reads vast's JSON numbers (which may come as strings) for the
offer ranking too.

A stopped instance: vast's documentation lists it `stopped`, and instances stopped with
`vastai stop instance` have been reported listed `exited` with `intended_status: stopped`
(SkyPilot's vast provisioner reads both as stopped and resumes either). `exited` alone means
a container that died (vast's docs: it never comes back), and the lifecycle rules destroy it
after 3 minutes; one whose owner stopped it is `stopped`, so that a parked instance is never
read as dead.

Pure: no HTTP, no clock.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from controller.core.model import Instance
from controller.fleet.base import SensorError

_BOOTING = ("provisioning", "created", "loading")


def to_instance(raw: Mapping[str, Any], unpriced_dph: float = 0.0) -> Instance:
    """One vast instance object as an `Instance`; SensorError on a field of the wrong type.

    A price vast does not give as a finite number of at least 0 (null, NaN, Infinity,
    negative, text) counts as `unpriced_dph` (the client passes its price cap: the most
    fleetgate pays), so that the spend cap never counts an instance as free."""
    iid = raw["id"]
    status = _text(raw, "actual_status") or "provisioning"
    intended = _text(raw, "intended_status")
    if status == "exited" and intended == "stopped":
        status = "stopped"  # stopped by its owner, as vast has been seen to list it
    dph = number(raw.get("dph_total"))
    if dph is None or dph < 0:
        dph = unpriced_dph
    start = raw.get("start_date")
    if start is not None and number(start) is None:
        raise SensorError(f"vast instance {iid!r}: start_date is not a number ({start!r})")
    gpus = raw.get("num_gpus")
    return Instance(
        id=str(iid),
        label=_text(raw, "label").strip(),
        machine_id=_text(raw, "machine_id"),
        host_id=_text(raw, "host_id"),
        status=status,
        stage="provisioning" if status in _BOOTING else "registered",
        daemon="unknown",
        sidecar="unknown",
        gpu_name=_text(raw, "gpu_name"),
        num_gpus=gpus if isinstance(gpus, int) and not isinstance(gpus, bool) else 1,
        dph=dph,
        status_msg=_text(raw, "status_msg").strip(),
        start_date=number(start),
        intended_status=intended,
    )


def number(value: Any, default: float | None = None) -> float | None:
    """A JSON number (or numeric string) as float; `default` for null; None when not a finite
    number (Python's JSON reads NaN and Infinity)."""
    if value is None:
        return default
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, str) and re.fullmatch(r"-?\d+(\.\d+)?", value.strip()):
        return float(value)
    return None


def _text(raw: Mapping[str, Any], name: str) -> str:
    value = raw.get(name)
    if value is None:
        return ""
    if isinstance(value, str | int) and not isinstance(value, bool):
        return str(value)
    raise SensorError(f"vast instance {raw.get('id')!r}: {name} is a {type(value).__name__}")
