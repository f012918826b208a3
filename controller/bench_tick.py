"""`fleetgate bench tick`: one controller tick per phase, on synthetic fleets of N instances.

For each size N it runs the real `Controller.tick()` (not a copy of it) against a synthetic
provider whose listing is a fixed, realistic mix (about 94% serving, 2% daemon down, 3% booting
in every stage, 1% exited) and a demand with pending tasks. The provider accepts every action
and changes nothing, so every tick sees the same mix. Two warm-up ticks fill the journal
(tracks, events, host rates, actions) before the measured ticks.

Phases are timed by wrapping, for the duration of the run, the very functions `Controller`
calls: the provider's listing and demand (sense: the listing is built before the tick, so
this is near zero), `journal.history` (history), `track.advance` (track), `build_facts`
(facts), `engine.match` (match), `decide` (decide), `guards.check` (guards),
`journal.save_tracks` and `journal.record` (journal), `Actuator.execute` (act: the synthetic
provider returns at once, so this is the journal bookkeeping around actions), the escalator's
`raise_all` and `resolve_cleared` (escalate). Times are exclusive (a phase nested in another
is not counted twice); `other` is the rest of the tick (rules reload check, approvals,
follow-ups, launches in flight, the listing sanity check, start/finish of the tick record).

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
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from controller import guards as guards_module
from controller import loop as loop_module
from controller.app import decide_settings
from controller.config import Config
from controller.engine import Engine
from controller.journal import Journal
from controller.loop import Controller
from controller.model import Demand, Health, Instance
from controller.providers.base import LaunchRequest
from controller.rulebook import load_texts
from controller.rules_source import RulesSource
from escalation.notify import Notifier
from escalation.render import Renderer
from escalation.router import Escalator

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("sense", "history", "track", "facts", "match", "decide", "guards", "journal", "act",
          "escalate", "other")  # fmt: skip
WARMUP_TICKS = 2
LARGE = 10_000  # at this size and above, at most LARGE_REPEAT measured ticks
LARGE_REPEAT = 3
_T0 = 1_700_000_000.0
_STEP_S = 30.0

# A ruleset with one trivial rule and every fact kind normal: what durable_rules costs by itself.
TRIVIAL_RULES = """\
normal:
  instance: {}
  demand: {}
  fleet: {}
  sensor: {}
rules:
  - name: trivial
    when:
      fleet: {}
    then: {action: hold}
    confidence: 1.0
"""

_BOOT: tuple[tuple[str, str, Health, Health], ...] = (  # (stage, status, daemon, sidecar)
    ("provisioning", "provisioning", "down", "down"),
    ("loading", "loading", "down", "down"),
    ("registered", "running", "down", "up"),
    ("params", "running", "down", "up"),
    ("bench", "running", "up", "up"),
)


def synthetic_instances(n: int, now: float) -> list[Instance]:
    """A fleet of `n`: per 100, 1 exited, 2 with the daemon down, 3 booting, 94 serving."""
    out = []
    for i in range(n):
        slot = i % 100
        start = _T0 - 7200 - (i % 50) * 60
        common: dict[str, Any] = {
            "id": str(10_000_000 + i), "label": f"fg-bench-{i}",
            "machine_id": str(500_000 + i // 2), "host_id": str(90_000 + i // 8),
            "gpu_name": "RTX 4090", "num_gpus": 1, "dph": round(0.30 + (i % 7) * 0.05, 2),
            "start_date": start,
        }  # fmt: skip
        if slot == 0:  # exited: never comes back; destroyed once past the grace time
            inst = Instance(**common, status="exited", stage="running", daemon="down",
                            sidecar="down", status_msg="container exited (137)")  # fmt: skip
        elif slot in (1, 2):  # cuzk died silently while the sidecar runs
            inst = Instance(**common, status="running", stage="running", daemon="down",
                            sidecar="up", bench_rate=40.0 + i % 20)  # fmt: skip
        elif slot in (3, 4, 5):  # booting, in various stages
            stage, status, daemon, sidecar = _BOOT[(i // 100 + slot) % len(_BOOT)]
            inst = Instance(**common, status=status, stage=stage, daemon=daemon, sidecar=sidecar,
                            daemon_uptime_s=now - start if daemon == "up" else None)  # fmt: skip
        else:  # serving
            inst = Instance(**common, status="running", stage="running", daemon="up",
                            sidecar="up", tasks_running=1 + i % 2, bench_rate=25.0 + i % 40,
                            daemon_uptime_s=now - start)  # fmt: skip
        out.append(inst)
    return out


class SyntheticFleet:
    """Provider and demand sensor: a fixed listing; every action is accepted and changes nothing."""

    def __init__(self, n: int, clock: Callable[[], float]) -> None:
        self.n = n
        self.clock = clock
        self.launched = 0
        self._listing: list[Instance] = []

    def prepare(self) -> None:
        """Build this tick's listing (untimed: a real listing is a network call)."""
        self._listing = synthetic_instances(self.n, self.clock())

    def list_instances(self) -> list[Instance]:
        return list(self._listing)

    def demand(self) -> list[Demand]:
        # a backlog: at 2 tasks per instance, (pending + running) / 2 is ~5% above the fleet
        pending, running = max(1, self.n * 6 // 10), self.n * 3 // 2
        return [Demand("PoRep", pending, running, 600.0), Demand("all", pending, running, 600.0)]

    def launch(self, request: LaunchRequest) -> str:
        self.launched += 1
        return str(90_000_000 + self.launched)

    def find_by_label(self, label: str) -> Instance | None:
        return None

    def destroy(self, instance_id: str) -> None: ...

    def reboot(self, instance_id: str) -> None: ...

    def restart_daemon(self, instance_id: str) -> None: ...

    def drain(self, instance_id: str) -> None: ...


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
def instrumented(c: Controller, phases: Phases) -> Iterator[None]:
    targets: list[tuple[object, str, str]] = [
        (c.provider, "list_instances", "sense"),
        (c.demand, "demand", "sense"),
        (c.journal, "history", "history"),
        (loop_module, "advance", "track"),
        (loop_module, "build_facts", "facts"),
        (c.rules.engine, "match", "match"),
        (loop_module, "decide", "decide"),
        (guards_module, "check", "guards"),
        (c.journal, "save_tracks", "journal"),
        (c.journal, "record", "journal"),
        (c.actuator, "execute", "act"),
        (c.escalator, "raise_all", "escalate"),
        (c.escalator, "resolve_cleared", "escalate"),
    ]
    with contextlib.ExitStack() as stack:
        for obj, name, phase in targets:
            stack.enter_context(_patched(obj, name, phases, phase))
        yield


def _controller(
    config: Config, n: int, journal: Journal, clock: list[float]
) -> tuple[Controller, SyntheticFleet]:
    fleet = SyntheticFleet(n, lambda: clock[0])
    settings = decide_settings(config)
    spend = sum(i.dph for i in synthetic_instances(n, _T0))
    limits = settings.guards.model_copy(  # limits sized for this fleet (else every tick vetoes)
        update={"max_instances": n + n // 10 + 10, "max_spend_per_hour": spend * 1.2 + 100,
                "paused": False})  # fmt: skip
    settings = settings.model_copy(update={"guards": limits})
    escalator = Escalator(journal, Notifier([], Renderer()), window_s=3600, deadline_s=1800)
    c = Controller(journal=journal, provider=fleet, demand=fleet,
                   rules=RulesSource([ROOT / "rules"]), settings=settings, escalator=escalator,
                   clock=lambda: clock[0])  # fmt: skip
    return c, fleet


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def bench_size(config: Config, n: int, repeat: int, trivial: Engine) -> dict[str, Any]:
    """Warm up, then time `repeat` ticks of a fleet of `n` and the engine floors."""
    with tempfile.TemporaryDirectory() as tmp:
        journal = Journal(Path(tmp) / "journal.db")
        try:
            clock = [_T0]
            c, fleet = _controller(config, n, journal, clock)
            for _ in range(WARMUP_TICKS):
                fleet.prepare()
                c.tick()
                clock[0] += 240.0  # past the exited instances' grace time
            phases = Phases()
            per_tick: list[dict[str, float]] = []
            planned = None
            with instrumented(c, phases):
                for _ in range(repeat):
                    clock[0] += _STEP_S
                    fleet.prepare()
                    phases.reset()
                    start = time.perf_counter()
                    planned = c.tick()
                    total = time.perf_counter() - start
                    spent = {p: phases.spent.get(p, 0.0) for p in PHASES if p != "other"}
                    spent["other"] = max(total - sum(spent.values()), 0.0)
                    spent["total"] = total
                    per_tick.append(spent)
            assert planned is not None
            facts, stamp = planned.facts, planned.now
            engine_s = _timed(lambda: c.rules.engine.match(facts, stamp), repeat)
            trivial_s = _timed(lambda: trivial.match(facts, stamp), repeat)
            verdicts: dict[str, int] = {}
            for d in planned.plan.decisions:
                verdicts[d.verdict] = verdicts.get(d.verdict, 0) + 1
            shape = {
                "facts": len(facts), "matches": len(planned.matches),
                "decisions": verdicts, "doubts": len(planned.doubts),
                "events": len(planned.events),
            }  # fmt: skip
        finally:
            journal.close()
    median = {k: statistics.median(t[k] for t in per_tick) for k in (*PHASES, "total")}
    engine_ms, trivial_ms = statistics.median(engine_s), statistics.median(trivial_s)
    return {
        "instances": n, "ticks": repeat, **shape,
        "phases_ms": {p: _ms(median[p]) for p in PHASES},
        "total_ms": _ms(median["total"]),
        "engine_ms": _ms(engine_ms),
        "engine_trivial_ms": _ms(trivial_ms),
        "ratio": round(median["total"] / engine_ms, 2) if engine_ms > 0 else None,
        "ratio_trivial": round(median["total"] / trivial_ms, 2) if trivial_ms > 0 else None,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }  # fmt: skip


def _timed(call: Callable[[], object], repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        out.append(time.perf_counter() - start)
    return out


def bench_tick(config: Config, sizes: Sequence[int], repeat: int) -> dict[str, Any]:
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)  # time the controller, not its log lines
    try:
        # whole facts: what durable_rules costs a controller that asserts every field it built
        trivial = Engine(load_texts([("bench/trivial.yaml", TRIVIAL_RULES)]), every_field=True)
        rows = [
            bench_size(config, n, min(repeat, LARGE_REPEAT) if n >= LARGE else repeat, trivial)
            for n in sizes
        ]
    finally:
        logging.disable(previous)
    return {
        "repeat": repeat, "warmup_ticks": WARMUP_TICKS, "phases": list(PHASES),
        "method": "Controller.tick() on a synthetic provider, phases timed by wrapping the "
                  "functions it calls (exclusive times); medians over the measured ticks",
        "engine": "engine_ms: Engine.match (assert + delete_state) of the shipped rules on the "
                  "last tick's facts; engine_trivial_ms: the same facts, one trivial rule",
        "peak_rss": "ru_maxrss of this process after the size ran (sizes run in order)",
        "sizes": rows,
    }  # fmt: skip


def render_tick(doc: dict[str, Any]) -> str:
    heads = ["N", *doc["phases"], "total", "engine", "trivial", "ratio", "x trivial", "RSS MB"]
    lines = []
    for r in doc["sizes"]:
        cells = [str(r["instances"]), *(f"{r['phases_ms'][p]:.2f}" for p in doc["phases"]),
                 f"{r['total_ms']:.2f}", f"{r['engine_ms']:.2f}", f"{r['engine_trivial_ms']:.2f}",
                 f"{r['ratio']}", f"{r['ratio_trivial']}", f"{r['peak_rss_mb']:.1f}"]  # fmt: skip
        lines.append(cells)
    widths = [max(len(h), *(len(row[k]) for row in lines)) for k, h in enumerate(heads)]
    out = ["  ".join(h.rjust(w) for h, w in zip(heads, widths, strict=True))]
    out += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in lines]
    out.append(
        f"(ms, median of the measured ticks; {doc['warmup_ticks']} warm-up ticks first; "
        "engine = shipped rules' match on the same facts, trivial = one-rule ruleset; "
        "ratio = total / engine, x trivial = total / trivial)"
    )
    return "\n".join(out)


def parse_sizes(text: str) -> list[int]:
    sizes = [int(s) for s in text.split(",") if s.strip()]
    if not sizes or any(n < 1 for n in sizes):
        raise ValueError(f"--instances wants positive counts separated by commas, not {text!r}")
    return sizes
