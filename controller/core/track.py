"""Tracked history: what the controller remembers between ticks, and how one tick updates it.

`advance(history, observation, now)` is pure: it returns the new per-instance tracks and the
events this tick revealed (stage and status changes, daemon deaths and restarts, benchmarks,
instances that vanished, hosts Curio timed). The journal stores both; `facts` derives temporal
fields from them.

Two rates are kept per host, apart: `host_rates`, what an instance benchmarked and reported of
itself (a claim, bounded per GPU model), and `measured`, how fast Curio timed the host's node
at its tasks. The launch ranking prefers the measurement once it has `MIN_MEASURED_TASKS`
tasks; the measurement never becomes an instance's `bench_rate` (the slow-instance rules judge
the benchmark, not the task mix).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, NamedTuple, cast

from controller.core.model import Health, Instance, Observation


class Track(NamedTuple):
    """One instance as remembered: when it entered its current stage, status and health.

    A named tuple, not a dataclass: one is built per instance per tick, and at 10,000
    instances a frozen dataclass's constructor alone costs about 10 ms a tick.
    """

    id: str
    machine_id: str
    first_seen: float
    stage: str
    stage_since: float
    status: str
    status_since: float
    daemon: str
    daemon_since: float
    idle_since: float | None = None
    bench_rate: float | None = None
    ever_up: bool = False  # the daemon has run once: a later start is a restart
    probe_fails: int = 0  # failed health probes in a row
    probe_failing_since: float | None = None  # the first of them
    # parked: fleetgate stopped it (its own `stop`, as journaled) at `parked_since`; a start
    # it sent since then at `start_asked`; both end once it runs again after the start
    parked_since: float | None = None
    start_asked: float | None = None
    # the journaled stop it left the pool from without a start of fleetgate's (started by
    # someone else, a start whose answer was lost, or a stop that never took): that stop
    # parks it no more
    left_stop: float | None = None
    # when it first reached stage running (first seen so: then); a later return to running
    # (after a start, a reboot) is not a boot
    served_at: float | None = None
    # cuzk's status server answered once (a failed probe not yet counted as down reads as up
    # but is no answer): one that never did may be off, not dead
    answered: bool = False
    # when the daemon started, on the probing clock (`restarted`): the latest of the estimates
    # that agree, kept through probes that failed or had no uptime while it counts as up
    started: float | None = None
    # the daemon is down since a death (it went down while the instance ran): its coming back
    # is a restart; down since the instance stopped, it is a start
    died: bool = False
    uptime: float | None = None  # last: changes every tick, so `t[:-1]` is all that matters


@dataclass(frozen=True)
class Debounce:
    """A daemon is down only after `count` failed probes in a row spanning `after_s`; until
    then a failed probe is a blip and the daemon stays as it was seen (up)."""

    count: int = 2
    after_s: float = 60.0


NO_DEBOUNCE = Debounce(1, 0.0)

# Two estimates of a daemon's start further apart than this are two starts. An estimate is at
# most a second late and at most 2 s early (`DaemonHealth.started_at`: a slower answer dates
# nothing); the clocks of the controller and the instance drift apart by seconds a day.
RESTART_SLACK_S = 10.0


def restarted(old: float | None, new: float | None) -> tuple[bool, float | None]:
    """(the daemon started again since `old`, the start to remember) from two estimates of
    its start: one more than `RESTART_SLACK_S` later is a new start, however long its uptime
    has grown since (a restart between two probes); otherwise the later one is kept (each is
    at most a second late), unless the clocks drifted the estimate more than the slack early."""
    if new is None:
        return False, old
    if old is None:
        return False, new
    if new - old > RESTART_SLACK_S:
        return True, new
    if old - new > RESTART_SLACK_S:
        return False, new
    return False, max(old, new)


def probe(
    old: Track | None, inst: Instance, now: float, d: Debounce
) -> tuple[Health, int, float | None]:
    """(daemon as the controller counts it, failed probes in a row, since when)."""
    if inst.daemon != "down":
        return inst.daemon, 0, None
    fails = (old.probe_fails if old is not None else 0) + 1
    since = old.probe_failing_since if old is not None else None
    since = now if since is None else since
    if old is not None and old.daemon == "down" and old.probe_fails == 0:
        return "down", fails, since  # down before counting began (an older journal)
    persisted = fails >= d.count and now - since >= d.after_s
    return ("down" if persisted else "up"), fails, since


@dataclass(frozen=True)
class Event:
    instance_id: str
    at: float
    kind: str  # seen, stage, status, death, restart, bench, gone, measured
    detail: dict[str, Any] = field(default_factory=dict)


MIN_MEASURED_TASKS = 3  # timed tasks before a measured rate outranks the host's claim
MEASURED_REFRESH_S = 3600.0  # an unchanged measurement is journaled again this often
MEASURED_CHANGE = 0.1  # ...and a changed one when it moved by this fraction


class Measured(NamedTuple):
    """A host as Curio timed it: its node's successful tasks in the measure window."""

    machine_id: str
    host_and_port: str  # the node, verified as the instance's (its public address)
    instance_id: str  # the instance that ran the node when it was measured
    tasks: int
    busy_s: float  # seconds the node was working on them (side by side counted once)
    rate: float  # weighted tasks per hour of working time, at most its GPUs' plausible bound
    at: float  # when it was read

    @property
    def enough(self) -> bool:
        return self.tasks >= MIN_MEASURED_TASKS

    def detail(self) -> dict[str, Any]:
        return {"machine_id": self.machine_id, "host_and_port": self.host_and_port,
                "tasks": self.tasks, "busy_s": round(self.busy_s, 3),
                "rate": round(self.rate, 6), "enough": self.enough}  # fmt: skip

    @classmethod
    def of_event(cls, instance_id: str, at: float, detail: dict[str, Any]) -> Measured:
        return cls(str(detail["machine_id"]), str(detail.get("host_and_port") or ""),
                   instance_id, int(detail["tasks"]), float(detail.get("busy_s") or 0.0),
                   float(detail["rate"]), at)  # fmt: skip


def measured_events(journaled: dict[str, Measured], sensed: dict[str, Measured],
                    now: float) -> list[Event]:  # fmt: skip
    """A `measured` event per host whose reading is new, crossed `MIN_MEASURED_TASKS`, moved
    by `MEASURED_CHANGE` or was last journaled `MEASURED_REFRESH_S` ago."""
    events = []
    for machine in sorted(sensed):
        m, old = sensed[machine], journaled.get(machine)
        fresh = (
            old is None or old.enough != m.enough or now - old.at >= MEASURED_REFRESH_S
            or abs(m.rate - old.rate) > MEASURED_CHANGE * max(old.rate, 1e-9)
        )  # fmt: skip
        if fresh:
            events.append(Event(m.instance_id, now, "measured", m.detail()))
    return events


SLOWER_THAN_CLAIMED = 0.5  # a host timed below this share of its claim ranks by the timing
MIN_PEERS_TO_SCALE = 3  # hosts both claimed and timed before timings are put on the claims' scale


def timed_as_claim(claims: dict[str, float], timed: dict[str, float]) -> dict[str, float]:
    """Curio's timings on the benchmarks' scale.

    A timed rate counts weighted tasks an hour, and how long a task runs is the work's as
    much as the host's (a queue of long tasks times every host slow). Where at least
    `MIN_PEERS_TO_SCALE` hosts have both a claim and a timing, each timing is multiplied by
    the fleet's median ratio of claim to timing: honest hosts then time at about their claim,
    whatever the work, and a host that claims more than it does stands out by how far it
    falls below. With fewer, the timings are taken as they are (weights that make one task
    one proof, as the weights in `curio.tasks` are meant to)."""
    ratios = sorted(claims[m] / r for m, r in timed.items() if r > 0 and claims.get(m))
    if len(ratios) < MIN_PEERS_TO_SCALE:
        return dict(timed)
    mid = len(ratios) // 2
    scale = ratios[mid] if len(ratios) % 2 else (ratios[mid - 1] + ratios[mid]) / 2
    return {m: r * scale for m, r in timed.items()}


BLOCK_S = 86_400.0  # a host's first block
BLOCK_MAX_S = 30 * 86_400.0  # the longest a block grows to


@dataclass(frozen=True)
class History:
    """The slice of the journal one tick's decision needs."""

    instances: dict[str, Track] = field(default_factory=dict)
    events: tuple[Event, ...] = ()  # recent events (the last few hours)
    host_rates: dict[str, float] = field(default_factory=dict)  # machine -> bench claim
    # machine -> as Curio timed it: `measured` as last journaled (recent), `measured_now` as
    # read for this tick (empty when Curio's history was not read)
    measured: dict[str, Measured] = field(default_factory=dict)
    measured_now: dict[str, Measured] = field(default_factory=dict)
    host_blocks: dict[str, float] = field(default_factory=dict)  # machine -> blocked until
    host_failures: dict[str, int] = field(default_factory=dict)  # machine -> blocks so far
    launches: tuple[float, ...] = ()  # launch times, recent
    last_acted: dict[str, float] = field(default_factory=dict)  # "action" or "action:target"
    replacing: frozenset[str] = frozenset()  # new instances that replace another
    retiring: frozenset[str] = frozenset()  # old instances waiting for their replacement
    pending_launches: int = 0  # launched, not yet in the listing: capacity on its way
    forecasts: dict[str, Any] = field(default_factory=dict)  # task -> core.forecast.Forecast
    # task (and `all`) -> mean seconds a run took on the fleet's own nodes, as Curio last
    # timed them (empty until it has)
    task_s: dict[str, float] = field(default_factory=dict)

    def count(self, instance_id: str, kind: str, since: float) -> int:
        events = self._by_instance.get(instance_id)
        if not events:  # most instances, most ticks
            return 0
        return sum(1 for e in events if e.kind == kind and e.at >= since)

    @cached_property
    def _by_instance(self) -> dict[str, list[Event]]:
        """Events per instance, built once (a fact per instance asks; scanning all is N x E)."""
        out: dict[str, list[Event]] = {}
        for e in self.events:
            out.setdefault(e.instance_id, []).append(e)
        return out

    def host_blocked(self, machine_id: str, now: float) -> bool:
        return self.host_blocks.get(machine_id, 0.0) > now

    def block_s(self, machine_id: str) -> float:
        """How long a new block keeps the host out: a day the first time, doubling with each
        block it already had (a crash-looping host is back in a day, then in 2, 4, ...), at
        most `BLOCK_MAX_S`."""
        return min(BLOCK_S * 2.0 ** min(self.host_failures.get(machine_id, 0), 16), BLOCK_MAX_S)

    def measured_rates(self) -> dict[str, float]:
        """machine -> the rate Curio measured, for hosts with enough timed tasks: this tick's
        reading, else the last journaled one."""
        rates = {m: x.rate for m, x in self.measured.items() if x.enough}
        rates.update((m, x.rate) for m, x in self.measured_now.items() if x.enough)
        return rates

    def launch_rates(self) -> dict[str, float]:
        """Rates to rank offers by: the host's (bounded) benchmark claim, lowered to what
        Curio measured where it timed enough tasks and the host is clearly slower than it
        claims (`timed_as_claim`); a host that was ever blocked counts as known slow (0.0)
        whatever its rate: once its block ends it is rented last, not first."""
        rates = dict(self.host_rates)
        for machine, timed in timed_as_claim(self.host_rates, self.measured_rates()).items():
            claim = rates.get(machine)
            if claim is None or timed < claim * SLOWER_THAN_CLAIMED:
                rates[machine] = timed
        rates.update((machine, 0.0) for machine in self.host_failures)
        return rates

    def launches_since(self, since: float) -> int:
        return sum(1 for t in self.launches if t >= since)


def _first(inst: Instance, now: float) -> tuple[Track, list[Event]]:
    idle = now if inst.stage == "running" and inst.tasks_running == 0 else None
    track = Track(
        id=inst.id, machine_id=inst.machine_id, first_seen=now, stage=inst.stage,
        stage_since=now, status=inst.status, status_since=now, daemon=inst.daemon,
        daemon_since=now, idle_since=idle, uptime=inst.daemon_uptime_s, bench_rate=inst.bench_rate,
        ever_up=inst.daemon == "up", served_at=now if inst.stage == "running" else None,
        started=inst.daemon_started_at,
    )  # fmt: skip
    events = [Event(inst.id, now, "seen", {"stage": inst.stage, "status": inst.status})]
    if inst.bench_rate is not None:
        events.append(Event(inst.id, now, "bench", _bench(inst)))
    return track, events


def first_track(inst: Instance, now: float) -> Track:
    """The track of `inst` first seen at `now`."""
    return _first(inst, now)[0]


def _bench(inst: Instance) -> dict[str, Any]:
    return {
        "machine_id": inst.machine_id,
        "rate": inst.bench_rate,
        "gpu": inst.gpu_name,
        "num_gpus": inst.num_gpus,
    }


def _step(old: Track, inst: Instance, now: float) -> tuple[Track, list[Event]]:
    events: list[Event] = []
    stage_since, status_since, daemon_since = old.stage_since, old.status_since, old.daemon_since
    if inst.stage != old.stage:
        events.append(Event(inst.id, now, "stage", {"from": old.stage, "to": inst.stage}))
        stage_since = now
    if inst.status != old.status:
        events.append(Event(inst.id, now, "status", {"from": old.status, "to": inst.status}))
        status_since = now
    evs, started = _daemon_events(old, inst, now)
    events += evs
    died = inst.daemon != "up" and (old.died or any(e.kind == "death" for e in evs))
    if inst.daemon != old.daemon:
        daemon_since = now
    idle_since = None
    if inst.stage == "running" and inst.tasks_running == 0:
        idle_since = now if old.idle_since is None else old.idle_since
    if inst.bench_rate is not None and inst.bench_rate != old.bench_rate:
        events.append(Event(inst.id, now, "bench", _bench(inst)))
    served = old.served_at
    if served is None and inst.stage == "running":
        served = now
    track = Track(old.id, old.machine_id, old.first_seen, inst.stage, stage_since, inst.status,
                  status_since, inst.daemon, daemon_since, idle_since, inst.bench_rate,
                  old.ever_up or inst.daemon == "up", served_at=served,
                  answered=old.answered, started=started, died=died,
                  uptime=inst.daemon_uptime_s)  # fmt: skip
    return track, events


def _daemon_events(old: Track, inst: Instance, now: float) -> tuple[list[Event], float | None]:
    """(deaths and restarts, the daemon's start to remember), including a restart hidden
    between two probes: its start moved on (`restarted`), or, where no start is known, its
    uptime went backwards. A tick it was not probed (unknown) changes nothing."""
    new = inst.daemon_started_at
    if inst.daemon == "down":
        died = old.daemon == "up" and inst.status == "running"
        return ([Event(inst.id, now, "death", {"uptime_before": old.uptime})] if died else []), None
    if inst.daemon != "up":  # not probed: nothing known of it this tick
        return [], old.started
    if old.daemon == "down":
        # back after a death (it went down while the instance ran): a restart, by whatever
        # brought it back; back after the instance was stopped (a warm pool's start), a start
        if old.died:
            return [Event(inst.id, now, "restart", {"down_for_s": now - old.daemon_since})], new
        return [], new
    again, started = restarted(old.started, new)
    went_back = (
        old.daemon == "up" and old.uptime is not None and inst.daemon_uptime_s is not None
        and inst.daemon_uptime_s < old.uptime
    )  # fmt: skip
    if not (again or went_back):
        return [], started
    detail: dict[str, Any] = {"uptime_before": old.uptime, "uptime_now": inst.daemon_uptime_s}
    if again and new is not None and old.started is not None:
        detail["started_later_s"] = round(new - old.started, 3)
    restart = [Event(inst.id, now, "death", detail), Event(inst.id, now, "restart", detail)]
    return restart, (new if new is not None else started)


def advance(hist: History, obs: Observation, now: float, debounce: Debounce = NO_DEBOUNCE
            ) -> tuple[dict[str, Track], list[Event]]:  # fmt: skip
    """New tracks for every listed instance, and the events since the last tick.

    A failed health probe counts as the daemon down only once failures persist (`debounce`):
    the track keeps the failures in a row and the first one's time, so a blip is no death;
    `debounced` gives the observation as the rest of the tick sees it.

    When the provider sensor failed, nothing is marked gone: an unknown listing is not empty;
    nor is an instance missing from a good listing that the provider did not confirm gone.
    """
    tracks: dict[str, Track] = {}
    events: list[Event] = []
    stopped = _stopped(hist.last_acted)
    for inst in obs.instances:
        old = hist.instances.get(inst.id)
        daemon, fails, since = probe(old, inst, now, debounce)
        answered = inst.daemon == "up"  # as probed, before a failure reads as up
        if daemon != inst.daemon:
            inst = replace(inst, daemon=daemon)
        track, evs = _first(inst, now) if old is None else _step(old, inst, now)
        if answered and not track.answered:
            track = track._replace(answered=True)
        if fails or (old is not None and old.probe_fails):
            track = track._replace(probe_fails=fails, probe_failing_since=since)
        if inst.id in stopped or (
            old is not None and (old.parked_since is not None or old.start_asked is not None)
        ):
            parked = _parked(old, inst, hist, now)
        else:  # not parked, no stop to park it: as `_parked` answers (a tenth of this loop)
            parked = (None, None, old.left_stop if old is not None else None)
        if parked != (track.parked_since, track.start_asked, track.left_stop):
            track = track._replace(parked_since=parked[0], start_asked=parked[1],
                                   left_stop=parked[2])  # fmt: skip
        tracks[inst.id] = track
        events += evs
    if obs.sensor_ok("provider"):
        unconfirmed = set(obs.unconfirmed)
        for gone in sorted(set(hist.instances) - set(tracks)):
            if gone in unconfirmed:  # missing, but not confirmed gone: kept as it was
                tracks[gone] = hist.instances[gone]
                continue
            events.append(Event(gone, now, "gone", {"machine_id": hist.instances[gone].machine_id}))
    else:
        for kept in set(hist.instances) - set(tracks):
            tracks[kept] = hist.instances[kept]
    if hist.measured_now:
        events += measured_events(hist.measured, hist.measured_now, now)
    return tracks, events


STOP_TAKES_S = 600.0  # a stop vast has not carried out in this long never took
STARTING = ("loading", "scheduling")  # a stopped instance on its way to running again
_STOP = "stop:instance:"  # the key of fleetgate's last stop of an instance in `last_acted`


def _stopped(last_acted: dict[str, float]) -> frozenset[str]:
    """The instances fleetgate journaled a stop of (the only ones `_parked` can park)."""
    return frozenset(k[len(_STOP) :] for k in last_acted if k.startswith(_STOP))


def _parked(old: Track | None, inst: Instance, hist: History, now: float
            ) -> tuple[float | None, float | None, float | None]:  # fmt: skip
    """(parked since, start asked at, left stop) for `inst`: parked from fleetgate's own
    `stop` (the journal's last one on it, newer than its last `start`) until it runs after a
    start. A stop nobody at fleetgate sent leaves it unparked (the lifecycle rules' stopped
    instance). One running again without a start of fleetgate's, after it was seen stopped
    (or loading) since the stop, was started by someone else or by a start whose answer was
    lost; one still running `STOP_TAKES_S` after the stop was never stopped (the controller
    died before calling vast, or the call did nothing): either leaves the pool, and that stop
    (`left stop`) parks it no more. One seen stopped that then loads or waits for its host
    (vast lists it stopped with `intended_status` running; `scheduling`) without a start of
    fleetgate's counts as asked from then, so the warm
    pool's rules destroy it if it waits too long, as they do one fleetgate started."""
    since = asked = left = None
    if old is not None:
        since, asked, left = old.parked_since, old.start_asked, old.left_stop
    acted = hist.last_acted
    key = f"instance:{inst.id}"  # the journal's target of an action on it
    stop_at, start_at = acted.get(f"stop:{key}"), acted.get(f"start:{key}")
    if (
        stop_at is not None
        and (start_at is None or stop_at > start_at)
        and (since is None or stop_at > since)
        and (left is None or stop_at > left)
    ):
        since, asked = stop_at, None
    if since is not None and start_at is not None and start_at >= since:
        asked = start_at if asked is None else max(asked, start_at)
    starting = inst.status in STARTING or (
        inst.status == "stopped" and inst.intended_status == "running")  # fmt: skip
    if (since is not None and asked is None and starting and old is not None
            and old.status == "stopped" and old.status_since >= since):  # fmt: skip
        asked = now  # started by someone else (a person, a start whose answer was lost)
    if since is None or inst.status != "running":
        return since, asked, left
    if asked is not None:  # started: by fleetgate's start, or seen starting without one
        return None, None, left if start_at is not None and start_at >= since else since
    seen_off = old is not None and old.status != "running" and old.status_since >= since
    if seen_off or now - since >= STOP_TAKES_S:
        return None, None, since
    return since, asked, left


def debounced(obs: Observation, tracks: dict[str, Track]) -> Observation:
    """The observation with each daemon as its track counts it (a blip is not down)."""
    changed = [replace(i, daemon=cast(Health, tracks[i.id].daemon)) if i.id in tracks
               and tracks[i.id].daemon != i.daemon else i for i in obs.instances]  # fmt: skip
    if all(a is b for a, b in zip(changed, obs.instances, strict=True)):
        return obs
    return replace(obs, instances=tuple(changed))
