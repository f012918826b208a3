"""`fleetgate bench tick`: one controller tick per phase, on fleets of N instances.

For each size N it runs the real `Controller.tick()` (not a copy of it) on a fleet holding a
fixed, realistic mix (per 100: 94 serving, 2 with the daemon down, 3 booting, 1 exited) and a
proving backlog (`controller.tools.bench.world`), on one of two paths:

- `real` (the default): the production fleet path (`fleet_path.real_fleet`: vast client
  and provider, Curio sensor, health probes, agent records and linking) on the simulator's
  wire, as `assemble` builds provider sim: the listing is HTTP through `requests` to the
  simulated vast (25 instances a page), Curio's rows answer the sensor's SQL, the probes answer
  for cuzk. Before each tick, untimed, the world is put back in its prepared state.
- `synthetic`: a listing built before the tick (it costs nothing) and a fixed demand; every
  action is accepted and changes nothing (the figures from before the real path).

Two warm-up ticks fill the journal first. Phases are timed by wrapping, for the run, the very
functions `Controller` calls: the provider's listing (sense; on the real path what
`RealFleet.list_instances` does around the four seams below: ownership, linking, health
persistence, enrich); on the real path `VastProvider.list_instances` and `confirm_gone`
(vast_list: HTTP, transport, parsing; also a `find_by_label` while acting), `CurioDemand.demand`
and `machines` (curio), `RealFleet.check_health` (health: the probes), `LifecycleStore.records`,
`record`, `link` (records: read and linked while listing; also a record looked up elsewhere in
the tick, e.g. to restart or drain); on the synthetic path the demand is in sense. Then
`journal.fleet.history` (history), `track.advance` (track), `build_facts` (facts), `engine.match`
(match), `decide` (decide), `guards.check` (guards), `fleet.save_tracks` and `actions.record`
(journal), `Actuator.execute` (act: on the real path HTTP to vast, the agents' command queue),
the escalator's `raise_all` and `resolve_cleared` (escalate). Times are exclusive (a phase
nested in another is not counted twice); `other` is the rest (rules reload check, approvals,
follow-ups, launches in flight, agent command timeouts, the listing sanity check, the tick
record, keeping probe failures). `sim` (real path) is the time inside the simulated vast, Curio
rows and probes, already in the phases above: what a real fleet spends on the network instead.

Beside the tick: the engine floor for the same facts, `Engine.match` of the shipped rules on
the last tick's facts (assert + delete_state; like the tick, it asserts only the fields the
rules name), and the floor of durable_rules itself, the same facts asserted whole into a
ruleset with a single trivial rule. Numbers, never assertions.
"""

from __future__ import annotations

import contextlib
import logging
import resource
import statistics
import tempfile
import time
import timeit
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controller.core import guards as guards_module
from controller.rules.engine import Engine
from controller.rules.rulebook import load_texts
from controller.service import plan as loop_module
from controller.service.config import Config
from controller.service.tick import Controller, Planned
from controller.store.journal import Journal
from controller.tools.bench.world import _T0 as _T0
from controller.tools.bench.world import SimBench, mix, sim_controller, synthetic_controller
from controller.tools.bench.world import SyntheticFleet as SyntheticFleet
from controller.tools.bench.world import synthetic_instances as synthetic_instances

PATHS = ("real", "synthetic")
PHASES = ("sense", "history", "track", "facts", "match", "decide", "guards", "journal", "act",
          "escalate", "other")  # fmt: skip
REAL_PHASES = (PHASES[0], "vast_list", "curio", "health", "records", *PHASES[1:])
SEAMS = ("vast", "curio", "probes")  # the simulated world's answers, apart (`sim`)
# Reading the world and changing it: what a fleet of N costs wherever it runs (on vast, 400
# list pages of 25 at 10,000 instances, about a second apart). The rest is the controller's own
# work on what it read (`own`): journal history, tracks, facts, match, decide, guards, records.
WORLD_PHASES = frozenset({"sense", "vast_list", "curio", "health", "records", "act"})
WARMUP_TICKS = 2
LARGE = 10_000  # at this size and above, at most LARGE_REPEAT measured ticks
LARGE_REPEAT = 3
_STEP_S = 30.0
Fleet = SyntheticFleet | SimBench
_controller = synthetic_controller  # what bench_soak and the tests import
Target = tuple[object, str, str]  # (object, attribute, phase)

# A ruleset with one trivial rule and every fact kind normal: what durable_rules costs by itself.
TRIVIAL_RULES = """\
normal: {instance: {}, demand: {}, fleet: {}, sensor: {}}
rules:
  - {name: trivial, when: {fleet: {}}, then: {action: hold}, confidence: 1.0}
"""


class Phases:
    """Exclusive wall time per phase: a wrapped call nested in another is subtracted from it."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}
        self._children: list[float] = []

    def reset(self) -> None:
        self.spent = {}

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            self._children.append(0.0)
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                inner = self._children.pop()
                self.spent[name] = self.spent.get(name, 0.0) + elapsed - inner
                if self._children:
                    self._children[-1] += elapsed

        return timed


@contextlib.contextmanager
def _patched(obj: object, name: str, phases: Phases, phase: str) -> Iterator[None]:
    """Time `obj.name` as `phase` (an instance attribute or a module global), then restore it."""
    had_own = name in vars(obj)
    original = getattr(obj, name)
    setattr(obj, name, phases.wrap(phase, original))
    try:
        yield
    finally:
        if had_own:
            setattr(obj, name, original)
        else:
            delattr(obj, name)


@contextlib.contextmanager
def instrumented(targets: Sequence[Target], phases: Phases) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for obj, name, phase in targets:
            stack.enter_context(_patched(obj, name, phases, phase))
        yield


def _targets(c: Controller, fleet: Fleet) -> list[Target]:
    """What each phase wraps (see the module docstring)."""
    sensing: list[Target] = [(c.provider, "list_instances", "sense"), (c.demand, "demand", "sense")]
    if isinstance(fleet, SimBench):
        real, store = fleet.fleet, fleet.store
        sensing = [(c.provider, "list_instances", "sense"),
                   (real.vast, "list_instances", "vast_list"),
                   (real.vast, "confirm_gone", "vast_list"), (c.demand, "demand", "curio"),
                   (real.curio, "machines", "curio"), (real, "check_health", "health"),
                   (store, "records", "records"), (store, "record", "records"),
                   (store, "link", "records")]  # fmt: skip
    return [*sensing, (c.journal.fleet, "history", "history"), (loop_module, "advance", "track"),
            (loop_module, "build_facts", "facts"), (c.rules.engine, "match", "match"),
            (loop_module, "decide", "decide"), (guards_module, "check", "guards"),
            (c.journal.fleet, "save_tracks", "journal"), (c.journal.actions, "record", "journal"),
            (c.actuator, "execute", "act"), (c.escalator, "raise_all", "escalate"),
            (c.escalator, "resolve_cleared", "escalate")]  # fmt: skip


def _seams(fleet: Fleet) -> list[Target]:
    """The simulated world's answers, timed apart (`sim`): they are inside the phases."""
    w = fleet.wire if isinstance(fleet, SimBench) else None
    return [(w.vast, "send", "vast"), (w.curio, "answer", "curio"),
            (w.seams, "check_many", "probes")] if w else []  # fmt: skip


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


@dataclass
class _Run:
    phases: tuple[str, ...]
    calls: Counter[str]  # at the simulated seams, during the measured ticks
    ticks: list[dict[str, float]] = field(default_factory=list)
    sim: list[dict[str, float]] = field(default_factory=list)
    mixes: list[dict[str, int]] = field(default_factory=list)
    planned: Planned | None = None


def _measure(c: Controller, fleet: Fleet, clock: list[float], repeat: int) -> _Run:
    """Warm-up ticks, then `repeat` timed ticks, each on a freshly prepared fleet."""
    for _ in range(WARMUP_TICKS):
        fleet.prepare()
        c.tick()
        clock[0] += 240.0  # past the exited instances' grace time
    run = _Run(REAL_PHASES if isinstance(fleet, SimBench) else PHASES, fleet.calls())
    main, seams = Phases(), Phases()
    with instrumented(_targets(c, fleet), main), instrumented(_seams(fleet), seams):
        for _ in range(repeat):
            clock[0] += _STEP_S
            fleet.prepare()
            main.reset()
            seams.reset()
            start = time.perf_counter()
            run.planned = c.tick()
            total = time.perf_counter() - start
            spent = {p: main.spent.get(p, 0.0) for p in run.phases if p != "other"}
            spent["other"] = max(total - sum(spent.values()), 0.0)
            run.ticks.append({**spent, "total": total})
            run.sim.append(dict(seams.spent))
            run.mixes.append(mix(run.planned.observation.instances))
    run.calls = fleet.calls() - run.calls
    return run


def _timed(call: Callable[[], object], repeat: int) -> list[float]:
    """Wall time of `repeat` calls, one by one (the garbage collector on, as in the tick)."""
    return timeit.repeat(call, setup="gc.enable()", repeat=repeat, number=1)


def bench_size(config: Config, n: int, repeat: int, trivial: Engine,
               path: str = "real") -> dict[str, Any]:  # fmt: skip
    """Warm up, then time `repeat` ticks of a fleet of `n` on `path`, and the engine floors."""
    with tempfile.TemporaryDirectory() as tmp:
        journal = Journal(Path(tmp) / "journal.db")
        try:
            clock = [_T0]
            build = sim_controller if path == "real" else synthetic_controller
            c, fleet = build(config, n, journal, clock)
            run = _measure(c, fleet, clock, repeat)
            assert run.planned is not None
            facts, stamp = run.planned.facts, run.planned.now
            engine_s = _timed(lambda: c.rules.engine.match(facts, stamp, reuse=False), repeat)
            trivial_s = _timed(lambda: trivial.match(facts, stamp, reuse=False), repeat)
        finally:
            journal.close()
    return _row(n, run, statistics.median(engine_s), statistics.median(trivial_s))


def _row(n: int, run: _Run, engine: float, trivial: float) -> dict[str, Any]:
    last = run.planned
    assert last is not None
    median = {k: statistics.median(t[k] for t in run.ticks) for k in (*run.phases, "total")}
    sim = {k: statistics.median(s.get(k, 0.0) for s in run.sim) for k in SEAMS}
    own = statistics.median(sum(v for k, v in t.items() if k not in WORLD_PHASES | {"total"})
                            for t in run.ticks)  # fmt: skip
    return {
        "instances": n, "ticks": len(run.ticks), "facts": len(last.facts),
        "matches": len(last.matches), "doubts": len(last.doubts), "events": len(last.events),
        "decisions": dict(Counter(d.verdict for d in last.plan.decisions)),
        "phases_ms": {p: _ms(median[p]) for p in run.phases},
        "total_ms": _ms(median["total"]),
        "sim_ms": {k: _ms(v) for k, v in sim.items()} if run.calls else {},
        "engine_ms": _ms(engine), "engine_trivial_ms": _ms(trivial),
        "ratio": round(median["total"] / engine, 2) if engine > 0 else None,
        "ratio_trivial": round(median["total"] / trivial, 2) if trivial > 0 else None,
        "own_ms": _ms(own),
        "own_trivial": round(own / trivial, 2) if trivial > 0 else None,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "mix": run.mixes[-1], "mix_stable": all(m == run.mixes[0] for m in run.mixes),
        "wire_calls": dict(sorted(run.calls.items())),
    }  # fmt: skip


def bench_tick(config: Config, sizes: Sequence[int], repeat: int,
               path: str = "real") -> dict[str, Any]:  # fmt: skip
    """Every size on `path` ("real" or "synthetic"), in order."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {', '.join(PATHS)}, not {path!r}")
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)  # time the controller, not its log lines
    try:
        # whole facts: what durable_rules costs a controller that asserts every field it built
        trivial = Engine(load_texts([("bench/trivial.yaml", TRIVIAL_RULES)]), every_field=True)
        rows = [bench_size(config, n, min(repeat, LARGE_REPEAT) if n >= LARGE else repeat,
                           trivial, path) for n in sizes]  # fmt: skip
    finally:
        logging.disable(previous)
    on = "the fleet path on a simulated world" if path == "real" else "a synthetic provider"
    return {
        "path": path, "repeat": repeat, "warmup_ticks": WARMUP_TICKS,
        "phases": list(REAL_PHASES if path == "real" else PHASES),
        "method": f"Controller.tick() on {on}, phases timed by wrapping the functions it "
                  "calls (exclusive times); medians over the measured ticks",
        "engine": "engine_ms: Engine.match (assert + delete_state) of the shipped rules on the "
                  "last tick's facts; engine_trivial_ms: the same facts, one trivial rule",
        "sim": "sim_ms: time inside the simulated vast transport, Curio rows, probes (in phases)",
        "peak_rss": "ru_maxrss of this process after the size ran (sizes run in order)",
        "sizes": rows,
    }  # fmt: skip


def render_tick(doc: dict[str, Any]) -> str:
    real = doc.get("path") == "real"
    heads = ["N", *doc["phases"], "total", *(["sim"] if real else []), "engine", "trivial",
             "ratio", "x trivial", "own", "own x trivial", "RSS MB"]  # fmt: skip
    lines = [[str(r["instances"]), *(f"{r['phases_ms'][p]:.2f}" for p in doc["phases"]),
              f"{r['total_ms']:.2f}", *([f"{sum(r['sim_ms'].values()):.2f}"] if real else []),
              f"{r['engine_ms']:.2f}", f"{r['engine_trivial_ms']:.2f}", f"{r['ratio']}",
              f"{r['ratio_trivial']}", f"{r['own_ms']:.2f}", f"{r['own_trivial']}",
              f"{r['peak_rss_mb']:.1f}"]
             for r in doc["sizes"]]  # fmt: skip
    widths = [max(len(h), *(len(row[k]) for row in lines)) for k, h in enumerate(heads)]
    out = ["  ".join(h.rjust(w) for h, w in zip(heads, widths, strict=True))]
    out += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in lines]
    out.append(
        f"({doc.get('path', 'synthetic')} path; ms, median of the measured ticks; "
        f"{doc['warmup_ticks']} warm-up ticks first; engine = shipped rules' match on the same "
        "facts, trivial = one-rule ruleset; ratio = total / engine, x trivial = total / trivial; "
        "own = the total less reading the world (sense, vast_list, curio, health, records) "
        "and acting on it (act)"
        + ("; sim = of the total, inside the simulated vast, Curio and probes)" if real else ")")
    )
    return "\n".join(out)


MAX_INSTANCES = 1_000_000  # a fleet in memory, built per size: past this it never ends


def parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:  # int's own words named neither the option nor what it wants
        sizes = []
    if not sizes or any(not 1 <= n <= MAX_INSTANCES for n in sizes):
        raise ValueError(f"--instances wants counts from 1 to {MAX_INSTANCES:,} separated by "
                         f"commas, not {text[:60]!r}")  # fmt: skip
    return sizes
