"""The real fleet as the controller sees it: vast's listing joined with what the instances
reported (lifecycle), whether cuzk answers (health) and what Curio says of their nodes.

`enrich` is pure; `RealFleet` does the reading around it and is the controller's fleet sensor
(it reads and never acts: what the controller does to the fleet is `controller.fleet.actions`):

- list: vast listing (a failed or implausibly empty one raises: never "zero instances"),
  lifecycle records, daemon health for instances past registration, Curio machines; and, at
  most every `measure_every_s`, Curio's task history, timed per host as `measured` (a host is
  timed only through a node verified as its instance's);
- restart_daemon: a command queued for the instance's agent (pulled on its next heartbeat);
  one not picked up in time shows as the instance's `command_overdue_s` (a shipped rule reboots
  it through vast, and the reboot closes the command);
- drain: Curio's `unschedulable` on the instance's node;
- launch, destroy, reboot, find_by_label: vast.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass, is_dataclass, replace
from typing import Any, Protocol, cast

from controller.core.gpu_rates import max_plausible
from controller.core.model import Instance
from controller.core.track import Measured
from controller.fleet.base import SensorError
from controller.fleet.curio import NodeRate, node_rates, task_seconds
from controller.store.records import LifecycleError

log = logging.getLogger(__name__)

BOOTING = frozenset({"provisioning", "created", "loading"})
# The agent reports milestones reached; the controller's stage is what the instance is doing:
# registered → fetching parameters; parameters done → benchmarking; benchmark done → still
# in the benchmark stage until it reports running (its 45-minute limit covers both).
DOING = {"registered": "params", "params": "bench", "bench": "bench", "running": "running"}


class Record(Protocol):
    """What an instance's agent reported (controller.store.records)."""

    @property
    def label(self) -> str: ...

    @property
    def stage(self) -> str: ...

    @property
    def bench_rate(self) -> float | None: ...

    @property
    def host_and_port(self) -> str | None: ...


class Health(Protocol):
    @property
    def up(self) -> bool: ...

    @property
    def uptime_s(self) -> float | None: ...

    @property
    def started_at(self) -> float | None: ...


class Machine(Protocol):
    @property
    def host_and_port(self) -> str: ...

    @property
    def last_contact_age_s(self) -> float: ...

    @property
    def unschedulable(self) -> bool: ...

    @property
    def running_tasks(self) -> int: ...

    @property
    def stale(self) -> bool: ...


def stage_of(inst: Instance, record: Record | None) -> str:
    """vast says whether the container runs; the agent says how far it got."""
    if inst.status in BOOTING:
        return "loading" if inst.status == "loading" else "provisioning"
    if record is not None and record.stage in DOING:
        return DOING[record.stage]
    return "loading"  # running container, agent not registered yet: unregistered


def node_host(host_and_port: str) -> str:
    """The host of a Curio `host_and_port` ("1.2.3.4:12300", "[::1]:12300")."""
    host = host_and_port.rsplit(":", 1)[0] if ":" in host_and_port else host_and_port
    return host.strip("[]")


def vouched(claimed: str, inst_ip: str, on_network: Callable[[str], bool],
            shared: Set[str]) -> bool:  # fmt: skip
    """Whether an agent's named node may be its instance's: on the instance's public address,
    or on a node network and named by no other instance."""
    host = node_host(claimed)
    return not inst_ip or host == inst_ip or (on_network(host) and claimed not in shared)


@dataclass(frozen=True)
class Link:
    """How one listed instance was joined to its agent's record and its Curio node."""

    record: Record | None
    node: Machine | None
    node_known: bool  # a node was ever known for it (one missing now is gone, not unknown)


def find_node(inst_ip: str, record: Record | None, by_node: Mapping[str, Machine],
              by_host: Mapping[str, list[Machine]], taken: Set[str] = frozenset(), *,
              on_network: Callable[[str], bool] = lambda host: False,
              shared: Set[str] = frozenset()) -> Machine | None:  # fmt: skip
    """The instance's Curio node: the one its agent named, if that node's host is the
    instance's public address, or lies on one of the config's node networks (`on_network`:
    a node behind vast's port mapping or on an overlay announces such an address) and no
    other instance's agent names it too (`shared`); else the only node on the public address
    that no other instance's record names (instances on one host share its address)."""
    claimed = record.host_and_port if record is not None else None
    if claimed and claimed in by_node and vouched(claimed, inst_ip, on_network, shared):
        return by_node[claimed]
    on_host = [m for m in by_host.get(inst_ip, []) if m.host_and_port not in taken] \
        if inst_ip else []  # fmt: skip
    return on_host[0] if len(on_host) == 1 else None


def measure(own: Sequence[Instance], links: Mapping[str, Link],
            rates: Mapping[str, NodeRate], now: float) -> dict[str, Measured]:  # fmt: skip
    """machine id -> its node's measured rate, for each own instance linked to a timed node.

    A node is an instance's only as `find_node` verified it (its host is the instance's public
    address), so an instance cannot take another node's times; a rate beyond what its GPUs
    can plausibly do (a node whose clock lies) is held to that bound."""
    out = {}
    for inst in own:
        node = links[inst.id].node if inst.id in links else None
        timed = rates.get(node.host_and_port) if node is not None else None
        if timed is None:
            continue
        rate = min(timed.rate, max_plausible(inst.gpu_name, inst.num_gpus))
        out[inst.machine_id] = Measured(inst.machine_id, timed.host_and_port, inst.id,
                                        timed.tasks, timed.busy_s, rate, now)  # fmt: skip
    return out


def enrich(listed: Sequence[Instance], links: Mapping[str, Link], health: Mapping[str, Health],
           sidecar_stale_s: float) -> list[Instance]:  # fmt: skip
    """One Instance per listed instance, with stage, daemon, sidecar, tasks and drain state.

    A sidecar is up when its node heartbeats, down when its node is stale or was known and is
    gone (Curio deleted it), and unknown when no node was ever found for an instance past its
    benchmark (it may be running tasks that nobody can see)."""
    out = []
    for inst in listed:
        link = links.get(inst.id, Link(None, None, False))
        record, node = link.record, link.node
        check = health.get(inst.id)
        stage = stage_of(inst, record)
        alive = node is not None and not node.stale and node.last_contact_age_s < sidecar_stale_s
        unknown = node is None and not link.node_known and stage in ("bench", "running")
        out.append(replace(
            inst,
            stage=stage,
            daemon="up" if check and check.up else ("down" if check else "unknown"),
            daemon_uptime_s=check.uptime_s if check and check.up else None,
            daemon_started_at=check.started_at if check and check.up else None,
            sidecar="up" if alive else ("unknown" if unknown else "down"),
            tasks_running=node.running_tasks if node else 0,
            drained=bool(node and node.unschedulable),
            bench_rate=record.bench_rate if record else None,
        ))  # fmt: skip
    return out


class RealFleet:
    """The controller's provider for a vast fleet with Curio nodes and fleetgate agents.

    Only instances this journal's launches rented are its own (`split`): by the id a create
    returned, or by the label of a launch whose create said nothing clear; one a person
    relabelled leaves the fleet. Everything else on the account is `foreign`: observed and
    shown, never managed."""

    def __init__(
        self,
        *,
        vast: Any,
        lifecycle: Any,
        curio: Any,
        check_health: Callable[[Sequence[Instance]], Mapping[str, Health]],
        clock: Callable[[], float],
        sidecar_stale_s: float = 180.0,
        launched: Callable[[], Mapping[str, str]] = dict,
        open_labels: Callable[[], Set[str]] = frozenset,
    ) -> None:
        self.vast = vast
        self.lifecycle = lifecycle
        self.curio = curio
        self.check_health = check_health
        self.clock = clock
        self.sidecar_stale_s = sidecar_stale_s
        self.launched = launched  # instance id -> launch label, of every launch that rented
        self.open_labels = open_labels  # labels of launches not yet known to have rented
        self.foreign: list[Instance] = []
        self._last: dict[str, Instance] = {}
        self.learned: dict[str, tuple[str, str, str | None]] = {}  # label -> link to write
        self.nodes: dict[str, str] = {}  # instance id -> its Curio node as last linked
        self.measured: dict[str, Measured] = {}  # machine id -> as Curio last timed it
        # task name (and `all`) -> mean seconds a run took on the fleet's own nodes, as last
        # timed: how long the pending tasks will take
        self.task_seconds: dict[str, float] = {}
        self._measured_at: float | None = None

    def list_instances(self) -> list[Instance]:
        listed = self.vast.list_instances()  # it knows when an empty listing is implausible
        launched = self.launched()
        own, self.foreign = self.split(listed, launched)
        records = self.lifecycle.records()
        try:
            machines = self.curio.machines()
        except SensorError as exc:
            raise SensorError(f"Curio nodes unknown: {exc}") from exc
        machines = [m for m in machines if not self._protected(m)]
        links = self._link(own, records, machines, launched)
        self.nodes = {iid: link.node.host_and_port for iid, link in links.items()
                      if link.node is not None}  # fmt: skip
        past_registration = [i for i in own
                             if stage_of(i, links[i.id].record)
                             in ("bench", "running")]  # fmt: skip
        self._measure(own, links)
        health = self.check_health(past_registration)  # as probed: the tick debounces it
        fleet = self._overdue(enrich(own, links, health, self.sidecar_stale_s), links)
        self._last = {i.id: i for i in fleet}
        return fleet

    def node_of(self, instance_id: str) -> str | None:
        """The Curio node (host:port) the last listing linked to this instance, if any: what a
        drain or undrain may touch, never what its agent merely names."""
        return self.nodes.get(instance_id)

    def _measure(self, own: Sequence[Instance], links: Mapping[str, Link]) -> None:
        """Time the own instances' nodes from Curio's task history (`measured`), at most every
        `measure_every_s`; a failed read keeps the last reading and fails nothing else."""
        settings = getattr(self.curio, "settings", None)
        read = getattr(self.curio, "task_timings", None)
        if settings is None or read is None:
            return
        now = self.clock()
        if self._measured_at is not None and now - self._measured_at < settings.measure_every_s:
            return
        try:
            timings = read()
        except SensorError as exc:
            log.warning("Curio task history unread (host rates as last measured): %s", exc)
            return
        self._measured_at = now
        self.measured = measure(own, links, node_rates(settings.tasks, timings), now)
        nodes = {link.node.host_and_port for i in own
                 if (link := links.get(i.id)) is not None and link.node is not None}  # fmt: skip
        self.task_seconds = task_seconds(settings.tasks, timings, nodes)

    def _overdue(self, fleet: list[Instance], links: Mapping[str, Link]) -> list[Instance]:
        """Each instance's oldest agent command past its deadline, as `command_overdue_s`."""
        now = self.clock()
        late: dict[str, float] = {}
        for cmd in self.lifecycle.overdue_commands(now):
            late[cmd.label] = max(late.get(cmd.label, 0.0), max(now - cmd.deadline, 1e-3))
        if not late:
            return fleet
        out = []
        for inst in fleet:
            record = links[inst.id].record
            overdue = late.get(record.label, 0.0) if record is not None else 0.0
            out.append(replace(inst, command_overdue_s=round(overdue, 3)) if overdue else inst)
        return out

    def split(self, listed: Sequence[Instance], launched: Mapping[str, str] | None = None
              ) -> tuple[list[Instance], list[Instance]]:  # fmt: skip
        """(own, foreign). Own: an instance a launch of this journal rented (by id), unless a
        person relabelled it (vast lists a label that is not its launch's: it leaves the fleet;
        an empty one does not, vast may show none); or one listed with the label of a launch
        whose create did not say what it rented. A label that merely looks like fleetgate's
        (a person's `fg-box`, another fleetgate's) is not enough."""
        launched = self.launched() if launched is None else launched
        open_labels: Set[str] | None = None
        own: list[Instance] = []
        foreign: list[Instance] = []
        for inst in listed:
            rented_as = launched.get(inst.id)
            if rented_as is not None:
                mine = inst.label in ("", rented_as)
            elif inst.label:
                open_labels = self.open_labels() if open_labels is None else open_labels
                mine = inst.label in open_labels
            else:
                mine = False
            (own if mine else foreign).append(inst)
        return own, foreign

    def confirm_gone(self, instance_ids: Sequence[str]) -> set[str]:
        """Which of these instances, missing from the listing, vast confirms are gone."""
        found: set[str] = self.vast.confirm_gone(instance_ids)
        return found

    def _link(self, own: Sequence[Instance], records: Mapping[str, Record],
              machines: Sequence[Machine], launched: Mapping[str, str]
              ) -> dict[str, Link]:  # fmt: skip
        """Each own instance's agent record and Curio node; what was learned is stored."""
        by_node = {m.host_and_port: m for m in machines}
        by_host: dict[str, list[Machine]] = {}
        for m in machines:
            by_host.setdefault(node_host(m.host_and_port), []).append(m)
        links = {}
        claims = Counter(r.host_and_port for r in records.values() if r.host_and_port)
        named, shared = set(claims), {hp for hp, n in claims.items() if n > 1}
        on_network = self._on_node_network
        for inst in own:
            # an own instance has a launch label (vast's, else the launch's that rented it): it
            # speaks through that label's record only, never an agent's claim of its vast id
            label = inst.label or launched.get(inst.id, "")
            record = records.get(label) if label else None
            ip = self._address(inst.id)
            node = find_node(ip, record, by_node, by_host, named - {record.host_and_port}
                             if record is not None else named, on_network=on_network,
                             shared=shared)  # fmt: skip
            if record is not None:
                record = self._remember(record, inst, node)
            known = bool(record and record.host_and_port
                         and vouched(record.host_and_port, ip, on_network, shared))  # fmt: skip
            links[inst.id] = Link(record, node, known)
        return links

    def _on_node_network(self, host: str) -> bool:
        """Whether the config's Curio node networks hold `host` (none are set by default)."""
        settings = getattr(self.curio, "settings", None)
        on_network = getattr(settings, "on_node_network", None)
        return bool(on_network and getattr(settings, "node_networks", ()) and on_network(host))

    def _protected(self, machine: Machine) -> bool:
        """A node the config protects (the operator's own) is never a fleet instance's node,
        whatever an instance claims: it is not linked, so never drained or undrained."""
        settings = getattr(self.curio, "settings", None)
        protects = getattr(settings, "protects", None)
        return bool(protects and protects(getattr(machine, "id", None), machine.host_and_port))

    def _address(self, instance_id: str) -> str:
        raw = getattr(self.vast, "last_raw", {}).get(instance_id, {})
        ip = raw.get("public_ipaddr") if isinstance(raw, Mapping) else None
        return ip.strip() if isinstance(ip, str) else ""

    def _remember(self, record: Record, inst: Instance, node: Machine | None) -> Record:
        """The record with the vast id, machine and verified Curio node learned this tick.

        Nothing is written while sensing: what changed waits in `learned` until the tick
        applies its plan (`save_learned`), so `explain` reads and never writes."""
        hp = node.host_and_port if node is not None else None
        if (getattr(record, "vast_id", None) == inst.id
                and getattr(record, "machine_id", None) == inst.machine_id
                and (hp is None or record.host_and_port == hp)):  # fmt: skip
            return record
        self.learned[record.label] = (inst.id, inst.machine_id, hp)
        changes = {"vast_id": inst.id, "machine_id": inst.machine_id}
        if hp is not None:
            changes["host_and_port"] = hp
        if is_dataclass(record) and not isinstance(record, type):
            return cast(Record, replace(record, **changes))
        return record

    def save_learned(self) -> None:
        """Write the links learned while sensing (after the tick's plan was applied)."""
        learned, self.learned = self.learned, {}
        for label, (vast_id, machine_id, hp) in learned.items():
            try:
                self.lifecycle.link(label, vast_id=vast_id, machine_id=machine_id,
                                    host_and_port=hp)  # fmt: skip
            except LifecycleError as exc:  # the agent's record went meanwhile
                log.info("instance %s: agent record %r not linked: %s", vast_id, label, exc)
                continue
            log.info("instance %s: linked to agent record %r (Curio node %s)", vast_id, label,
                     hp or "unknown")  # fmt: skip
