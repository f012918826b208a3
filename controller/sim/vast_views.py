"""vast.ai's JSON for the simulated world: offers, instance objects and search terms.

Pure functions from the world's records to the dicts vast's API answers with, in vast's names
and units (RAM in MB, prices in $/hour, ids as ints from `addresses`). The static specs vast
shows for a machine (RAM, cores, disk, network, CUDA, reliability, place) are hashed from its
id: nothing is drawn from the world's RNG. Only what vast knows goes out, never an instance's
stage, daemon, sidecar or bench rate.

Must not decide anything about the fleet; no I/O, no clock.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from controller.sim import addresses
from controller.sim.account import ForeignInstance, unit
from controller.sim.instance import SimInstance
from controller.sim.machines import Machine

ASK_BASE = 7_000_000  # an offer's ask id is ASK_BASE + its vast machine id
OPS = ("eq", "neq", "gt", "gte", "lt", "lte", "in", "notin")
_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "gt": operator.gt, "gte": operator.ge, "lt": operator.lt, "lte": operator.le,
}  # fmt: skip
_GPU_RAM_MB = {"RTX 4090": 24564, "RTX 5090": 32607, "A100 PCIE": 40960, "H100 SXM": 81559}
_CPU_RAM_MB = (257_000, 386_000, 515_000, 1_031_000)
_CORES = (32, 48, 64, 128)
_DISK_GB = (500.0, 1000.0, 2000.0)
MACHINES_CACHED = 1 << 16  # above the largest world benched (10,000 machines): no thrashing
ROWS_CACHED = 1 << 14  # instance objects, shared (never mutated): one per instance and state
_PLACES = ("Sweden, SE", "Texas, US", "Quebec, CA", "Bavaria, DE", "Ontario, CA", "Oregon, US")


@dataclass(frozen=True)
class Specs:
    """What vast shows of a machine beside the simulator's own fields; all pass fleetgate's
    default filter (cpu_ram >= 240 GB, > 25 cores, disk >= 250, CUDA >= 13, ...)."""

    gpu_ram: int
    cpu_ram: int
    cpu_cores: int
    disk_space: float
    inet_down: float
    reliability: float
    cuda_max_good: float
    geolocation: str


@functools.lru_cache(maxsize=MACHINES_CACHED)
def specs(machine: Machine) -> Specs:
    """The machine's static specs, fixed by its id (a hash, no RNG)."""
    mid = machine.machine_id

    def pick(options: Sequence[Any], what: str) -> Any:
        return options[int(unit(0, mid, what) * len(options))]

    return Specs(
        gpu_ram=_GPU_RAM_MB.get(machine.gpu_name, 24564),
        cpu_ram=pick(_CPU_RAM_MB, "cpu_ram"),
        cpu_cores=pick(_CORES, "cores"),
        disk_space=pick(_DISK_GB, "disk"),
        inet_down=round(200.0 + 4800.0 * unit(0, mid, "inet"), 1),
        reliability=round(0.96 + 0.039 * unit(0, mid, "reliability"), 4),
        cuda_max_good=pick((13.0, 13.0, 13.1), "cuda"),
        geolocation=pick(_PLACES, "place"),
    )


def ask_id(machine_id: str) -> int:
    """The ask (offer) id of the simulator's machine `machine_id`."""
    return ASK_BASE + addresses.vast_machine_id(machine_id)


def machine_of_ask(ask: int) -> str:
    """The simulator's machine id of an ask id (it may name no machine)."""
    return addresses.sim_machine_id(ask - ASK_BASE) if ask > ASK_BASE else ""


def offer(machine: Machine) -> dict[str, Any]:
    """The offer of an unrented machine, as `POST /api/v0/bundles/` lists it."""
    s = specs(machine)
    return {
        "id": ask_id(machine.machine_id), "ask_contract_id": ask_id(machine.machine_id),
        "machine_id": addresses.vast_machine_id(machine.machine_id),
        "host_id": addresses.vast_host_id(machine.host_id), "gpu_name": machine.gpu_name,
        "num_gpus": machine.num_gpus, "gpu_ram": s.gpu_ram, "cpu_ram": s.cpu_ram,
        "cpu_cores": s.cpu_cores, "disk_space": s.disk_space, "inet_down": s.inet_down,
        "dph_total": machine.dph, "reliability": s.reliability,
        "cuda_max_good": s.cuda_max_good, "geolocation": s.geolocation, "verified": True,
        "rentable": True, "rented": False, "external": False,
    }  # fmt: skip


def instance(
    inst: SimInstance, machine: Machine, label: str, disk_gb: float = 0.0
) -> dict[str, Any]:
    """A world instance as vast shows it, with `label` as vast's API label."""
    status = None if inst.status == "provisioning" else inst.status
    row = _row(inst.id, machine, label, status, inst.status_msg, inst.launched_at)
    if inst.status != "stopped":
        return row
    # stopped: it bills its disk only (shown as its price); a start waiting for the host's
    # GPUs ("scheduling") is stopped with intended status running
    storage = machine.storage_per_gb_h * disk_gb
    if inst.start_at is not None:
        return {**row, "dph_total": round(storage, 4), "intended_status": "running"}
    return {**stopped_as_listed(row), "dph_total": round(storage, 4)}


def foreign(inst: ForeignInstance, machine: Machine) -> dict[str, Any]:
    """An instance of the account that fleetgate did not launch."""
    msg = "" if inst.status == "stopped" else "success, running"
    row = _row(inst.id, machine, inst.label, inst.status, msg, inst.start_date)
    return stopped_as_listed(row) if inst.status == "stopped" else row


def stopped_as_listed(row: dict[str, Any]) -> dict[str, Any]:
    """A stopped instance's object in both of the ways vast lists one: `stopped`, as its docs
    say (even ids), and `exited` with `intended_status: stopped`, as instances stopped with
    `vastai stop instance` have been reported listed (odd ids; SkyPilot's vast provisioner
    reads both as stopped)."""
    if row["id"] % 2 == 0:
        return {**row, "actual_status": "stopped", "intended_status": "stopped"}
    return {**row, "actual_status": "exited", "intended_status": "stopped",
            "cur_state": "stopped"}  # fmt: skip


@functools.lru_cache(maxsize=ROWS_CACHED)
def _row(
    iid: str, machine: Machine, label: str, status: str | None, msg: str, start: float
) -> dict[str, Any]:
    n = int(iid)
    state = "stopped" if status == "stopped" else "running"
    fixed = _machine_part(machine)
    return {
        "id": n, **fixed, "label": label, "actual_status": status, "intended_status": state,
        "cur_state": state, "status_msg": msg, "start_date": start,
        "mem_usage": round(fixed["mem_limit"] * 0.05, 1) if status == "running" else 0.0,
        "ssh_host": f"ssh{1 + n % 9}.vast.ai", "ssh_port": 20000 + n % 10000,
        "ports": addresses.ports(iid),
    }  # fmt: skip


@functools.lru_cache(maxsize=MACHINES_CACHED)
def _machine_part(machine: Machine) -> dict[str, Any]:
    """The fields of an instance object that come from its machine (shared: never mutate)."""
    s = specs(machine)
    return {
        "machine_id": addresses.vast_machine_id(machine.machine_id),
        "host_id": addresses.vast_host_id(machine.host_id), "gpu_name": machine.gpu_name,
        "num_gpus": machine.num_gpus, "gpu_ram": s.gpu_ram, "cpu_ram": s.cpu_ram,
        "mem_limit": round(s.cpu_ram / 1000.0, 1), "dph_total": machine.dph,
        "reliability2": s.reliability, "public_ipaddr": addresses.public_ip(machine.machine_id),
        "geolocation": s.geolocation,
    }  # fmt: skip


# ---- search terms ------------------------------------------------------------------------


def terms(body: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The filter terms of a query ({field: {op: value}}); other keys (order, type, limit,
    allocated_storage, ...) are not terms. ValueError on an unknown operator."""
    found = {k: v for k, v in body.items() if isinstance(v, dict)}
    for name, term in found.items():
        bad = sorted(set(term) - set(OPS))
        listy = all(isinstance(term[op], list) for op in ("in", "notin") if op in term)
        if bad or not term or not listy:
            raise ValueError(f"bad term {name!r}: {term!r}")
    return found


def matches(item: Mapping[str, Any], query: Mapping[str, Mapping[str, Any]]) -> bool:
    """Whether `item` satisfies every term (a field it lacks is null)."""
    return all(
        _holds(item.get(name), op, want)
        for name, term in query.items()
        for op, want in term.items()
    )


def _holds(value: Any, op: str, want: Any) -> bool:
    if op == "eq":
        return bool(value == want)
    if op == "neq":
        return bool(value != want)
    if op == "in":
        return value in want
    if op == "notin":
        return value not in want
    numbers = all(isinstance(x, int | float) and not isinstance(x, bool) for x in (value, want))
    return numbers and _COMPARE[op](value, want)


def ordered(items: Iterable[dict[str, Any]], order: Any) -> list[dict[str, Any]]:
    """`items` sorted by vast's `order` ([[field, "asc"|"desc"], ...], nulls last)."""
    result = list(items)
    if not isinstance(order, list):
        raise ValueError(f"bad order {order!r}")
    for pair in reversed(order):
        if not (isinstance(pair, list) and len(pair) == 2 and pair[1] in ("asc", "desc")):
            raise ValueError(f"bad order {pair!r}")
        name, desc = pair[0], pair[1] == "desc"
        known = [o for o in result if o.get(name) is not None]
        known.sort(key=operator.itemgetter(name), reverse=desc)
        result = known + [o for o in result if o.get(name) is None]
    return result
