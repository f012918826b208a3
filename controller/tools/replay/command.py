"""`fleetgate simulate`: replay a trace through the controller and the baselines.

1. load the config (the simulator's world, rules, guards, settings) and the trace;
2. cut the trace to the horizon (`--days`, else the last arrival plus the deadline), in whole
   ticks;
3. run fleetgate on it (`run.run_fleetgate`), its journal in REPORT/state, one run at a time
   per REPORT (`claim`);
4. run the baselines on the same tasks, with the world's boot time, slots and fleet cap: the
   static fleet, the proportional scaler and four oracles in the fluid model (`baselines`,
   `market`: with and without stop and start, on the market's machines, without task moves),
   the proportional scaler again on the simulated world (`in_world`);
5. write REPORT/report.json and REPORT/simulate.png; print the table.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

from controller.service.config import Config, load_config
from controller.sim import SimConfig, Simulation, shapes
from controller.sim.trace import (
    FORMAT_DEFAULT,
    FORMATS,
    Columns,
    RowFilter,
    TraceTask,
    columns,
    load_trace,
    timezone_named,
    trace_format,
)
from controller.tools.replay import baselines, in_world, market, report
from controller.tools.replay.claim import ReportInUse, claim_report
from controller.tools.replay.results import (
    BaselineParams,
    Outcome,
    fault_rework,
    mean_boot_s,
    task_hazard_per_h,
)
from controller.tools.replay.run import (
    FleetgateRun,
    RunSpec,
    run_fleetgate,
    ticks_for,
    trace_config,
)

DAY = 86400.0
DEADLINE_S = 3600.0
COOLDOWN_S = 300.0
SHAPE_DAYS = 7.0  # a generated shape's length without --days
# a trace longer than this (the shipped one is 149 days) is run only when --days asks for it:
# one sentinel timestamp (epoch 0 beside 2024, milliseconds read as seconds) made runs of years
LONGEST_UNASKED_DAYS = 400
SAMPLES = 3000  # points per time series in the chart


def add_parser(sub: Any) -> None:
    """The `simulate` subcommand and its options (`sub`: the CLI's subparsers)."""
    p = sub.add_parser("simulate", help="replay a task trace: fleetgate beside the baselines")
    add = p.add_argument
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", metavar="FILE", help="the tasks: a CSV, or a Standard "
                        "Workload Format log (.swf) of the Parallel Workloads Archive")  # fmt: skip
    source.add_argument("--shape", choices=shapes.SHAPES, help="a generated workload instead of "
                        "a trace: short = 20-120 s tasks, daily and weekly cycles, bursts "
                        "(seeded by --seed; --days, default 7)")  # fmt: skip
    add("--days", type=float, metavar="N",
        help="virtual days to run (default: to the last arrival plus the deadline)")  # fmt: skip
    add("--config", dest="simulate_config", metavar="FILE",
        help="config file (default: the global --config, else the defaults)")  # fmt: skip
    add("--report", default="simulate-report", metavar="DIR",
        help="report.json, simulate.png and the journal (default: ./simulate-report)")  # fmt: skip
    add("--seed", type=int, metavar="S", help="simulator seed (default: the config's sim.seed)")
    add("--format", choices=FORMATS, dest="trace_format",
        help="the trace's format (default: swf for a .swf or .swf.gz file, else csv); an SWF "
        "log's columns are named as in the format's definition: submit_time, wait_time, "
        "run_time, status, queue_number, ...")  # fmt: skip
    add("--arrival-col", metavar="COL",
        help="arrival time column: seconds, or a timestamp such as 2024-11-15 16:57:50 "
        "(default: creation_time; SWF: submit_time)")  # fmt: skip
    end = p.add_mutually_exclusive_group()
    end.add_argument("--end-col", metavar="COL",
                     help="end time column, as the arrival's (default: deletion_time)")  # fmt: skip
    end.add_argument("--service-col", metavar="COL", help="service time column, seconds "
                     "(instead of --end-col; default for SWF: run_time)")  # fmt: skip
    add("--time-format", metavar="FMT", help="strptime format of the time columns, e.g. "
        "'%%d/%%m/%%Y %%H:%%M' (default: seconds, or ISO-like timestamps)")  # fmt: skip
    add("--tz", default="UTC", metavar="ZONE",
        help="time zone of timestamps without an offset (default: UTC)")  # fmt: skip
    add("--where", action="append", default=[], metavar="COL=VALUE",
        help="keep only rows where COL equals VALUE (COL!=VALUE: differs); repeatable, "
        "all must hold, e.g. --where status!=failed --where status!=pending")  # fmt: skip
    add("--gpu-col", metavar="COL",
        help="GPU-count column, a filter only: rows where it is 0 are skipped, any other "
        "count is one task (default: num_gpu; SWF: none; '' keeps every row)")  # fmt: skip
    add("--time-scale", type=float, metavar="F", help="factor on arrival times "
        "(default: the config's sim.world.trace_time_scale, else 1)")  # fmt: skip
    add("--service-scale", type=float, metavar="F", help="factor on service times "
        "(default: the config's sim.world.trace_service_scale, else 1)")  # fmt: skip
    add("--min-service-s", type=float, metavar="S",
        help="floor on a service time after scaling (default: none)")  # fmt: skip
    add("--max-service-s", type=float, metavar="S",
        help="cap on a service time after scaling (default: none)")  # fmt: skip
    add("--deadline-s", type=float, default=DEADLINE_S, metavar="S",
        help=f"a task waiting longer to start misses it (default: {DEADLINE_S:g})")  # fmt: skip
    add("--cooldown-s", type=float, default=COOLDOWN_S, metavar="S",
        help=f"proportional baseline's scale-down window (default: {COOLDOWN_S:g})")  # fmt: skip
    add("--baseline-dph", type=float, metavar="USD",
        help="baselines' $ per instance-hour (default: fleetgate's average)")  # fmt: skip
    add("--answer-after-s", type=float, metavar="S", help="a stand-in operator answers each "
        "escalation this long after it is raised (default: nobody answers)")  # fmt: skip


def simulate(args: argparse.Namespace) -> int:
    """Steps 1 to 5; 2 on a bad trace or option, 0 otherwise."""
    from controller.tools.replay import chart  # matplotlib takes a while to import: only here

    started = time.perf_counter()
    config = load_config(args.simulate_config or args.config)
    problem = _check(args, config)
    if problem:
        print(f"fleetgate simulate: {problem}", file=sys.stderr)
        return 2
    scales = (_scale(args.time_scale, config, "trace_time_scale"),
              _scale(args.service_scale, config, "trace_service_scale"))  # fmt: skip
    try:
        tasks = _load(args, scales, config.sim.seed if args.seed is None else args.seed)
    except (ValueError, OSError) as exc:
        print(f"fleetgate simulate: {exc}", file=sys.stderr)
        return 2
    if not tasks:
        print(f"fleetgate simulate: no tasks in {args.trace or args.shape}", file=sys.stderr)
        return 2
    step = config.sim.seconds_per_tick
    span = args.days * DAY if args.days else tasks[-1].arrival_s + args.deadline_s
    span = SHAPE_DAYS * DAY if args.shape and not args.days else span
    if not args.days and span > LONGEST_UNASKED_DAYS * DAY:
        print(f"fleetgate simulate: the trace runs {span / DAY:,.0f} days to its last arrival "
              f"(an outlier or a timestamp in other units?); --days N runs N days, and a run "
              f"longer than {LONGEST_UNASKED_DAYS} days is run only when --days asks for it",
              file=sys.stderr)  # fmt: skip
        return 2
    ticks = ticks_for(span, step)
    horizon = ticks * step
    tasks = baselines.within(tasks, horizon)
    sample_ticks = max(1, round(ticks / SAMPLES))
    out = Path(args.report)
    try:
        lock = claim_report(out)
    except (ReportInUse, OSError) as exc:
        print(f"fleetgate simulate: {exc}", file=sys.stderr)
        return 2
    with lock:  # until the report is written: another run would delete the journal under it
        seed = config.sim.seed if args.seed is None else args.seed
        spec = RunSpec(tasks, ticks, out / "state", seed=seed, sample_ticks=sample_ticks,
                       progress=sys.stderr.isatty(),
                       answer_after_s=args.answer_after_s)  # fmt: skip
        run = run_fleetgate(config, spec)
        params = _params(args, config, run, horizon, sample_ticks * step)
        world = Simulation(SimConfig.model_validate(
            trace_config(config, spec.state / "trace.csv").sim.world), seed)  # fmt: skip
        best = _market(world, params)  # before the world's own proportional scaler rents in it
        outcomes = [
            run.outcome,
            baselines.static_peak(tasks, params),
            baselines.proportional(tasks, params),
            in_world.proportional_in_world(world, params, ticks),
            baselines.oracle(tasks, params),
            baselines.oracle(tasks, params, warm=True),
            market.market_oracle(tasks, params, best),
            _placed(tasks, params),
        ]
        meta = _meta(args, scales, tasks, ticks, seed, run)
        hazard = task_hazard_per_h(SimConfig.model_validate(config.sim.world))
        rework = fault_rework([t.service_s for t in tasks], hazard)
        meta["faults"] = {
            "task_hazard_per_h": round(hazard, 6),
            "rework": round(rework, 4) if math.isfinite(rework) else None,  # None: past counting
        }
        png = chart.draw(out / "simulate.png", outcomes, _title(args, meta))
        meta["wall_s"] = {"total": round(time.perf_counter() - started, 2),
                          "fleetgate": round(run.wall_s, 2)}  # fmt: skip
        doc = report.build(outcomes, params, run=_run_doc(run), meta=meta)
        report.write(out, doc)
        print(report.render(doc))
        print(f"report: {out / 'report.json'}, chart: {png or 'none (no matplotlib)'}, "
              f"journal: fleetgate --state {out / 'state'} actions")  # fmt: skip
        return 0


# the options that read or reshape a trace file (`--format` is `trace_format`)
TRACE_ONLY = ("trace_format", "arrival_col", "end_col", "service_col", "time_format", "tz",
              "where", "gpu_col", "time_scale", "service_scale", "min_service_s",
              "max_service_s")  # fmt: skip


def _check(args: argparse.Namespace, config: Config) -> str:
    if config.provider != "sim" or config.demand != "sim":
        return (f"the config's provider is {config.provider!r} and demand {config.demand!r}; "
                "simulate runs the built-in simulator (provider: sim, demand: sim)")  # fmt: skip
    names = ("days", "time_scale", "service_scale", "max_service_s", "deadline_s", "baseline_dph")
    for name in (*names, "min_service_s", "cooldown_s", "answer_after_s"):
        value = getattr(args, name)
        if value is not None and not math.isfinite(value):  # nan passed every test below
            return f"--{name.replace('_', '-')} must be a finite number, got {value!r}"
    for name in names:
        value = getattr(args, name)
        if value is not None and value <= 0:
            return f"--{name.replace('_', '-')} must be > 0, got {value!r}"
    if args.cooldown_s < 0 or (args.answer_after_s is not None and args.answer_after_s < 0):
        return "--cooldown-s and --answer-after-s must be >= 0"
    if args.shape:  # a generated shape reads no file: these would be ignored without a word
        given = [f"--{name.replace('_', '-')}" for name in TRACE_ONLY
                 if getattr(args, name) not in (None, [], "UTC")]  # fmt: skip
        if given:
            return f"{', '.join(given)}: for a trace file only; --shape generates its tasks"
    low, high = args.min_service_s, args.max_service_s
    if low is not None and (low < 0 or (high is not None and low > high)):
        return f"--min-service-s must be >= 0 and at most --max-service-s, got {low!r}"
    try:
        timezone_named(args.tz)
    except ValueError as exc:
        return f"--tz: {exc}"
    for text in args.where:
        try:
            RowFilter.parse(text)
        except ValueError as exc:
            return f"--where: {exc}"
    return ""


def _scale(given: float | None, config: Config, key: str) -> float:
    if given is not None:
        return given
    return float(config.sim.world[key]) if key in config.sim.world else 1.0


def _columns(args: argparse.Namespace) -> Columns:
    """The trace's columns: those named, else its format's (`--gpu-col ''`: no filter)."""
    gpu = FORMAT_DEFAULT if args.gpu_col is None else args.gpu_col or None
    fmt = trace_format(args.trace or "", args.trace_format)
    return columns(fmt, args.arrival_col, args.end_col, args.service_col, gpu)


def _load(args: argparse.Namespace, scales: tuple[float, float], seed: int) -> list[TraceTask]:
    if args.shape:
        return shapes.tasks_of(args.shape, args.days or SHAPE_DAYS, seed)
    cols = _columns(args)
    return load_trace(
        args.trace,
        fmt=args.trace_format,
        arrival_col=cols.arrival,
        end_col=cols.end,
        service_col=cols.service,
        filter_gpu_col=cols.gpu,
        time_scale=scales[0],
        service_scale=scales[1],
        min_service_s=args.min_service_s,
        max_service_s=args.max_service_s,
        time_format=args.time_format,
        tz=args.tz,
        where=[RowFilter.parse(w) for w in args.where],
    )


def _params(
    args: argparse.Namespace, config: Config, run: FleetgateRun, horizon: float, sample_s: float
) -> BaselineParams:
    world = SimConfig.model_validate(config.sim.world)
    return BaselineParams(
        boot_s=mean_boot_s(world), dph=args.baseline_dph or run.outcome.dph,
        slots=world.slots_per_instance, horizon_s=horizon, deadline_s=args.deadline_s,
        tasks_per_instance=int(config.settings.get("tasks_per_instance", 2)),
        interval_s=config.sim.seconds_per_tick, cooldown_s=args.cooldown_s,
        max_instances=config.guards.max_instances, sample_s=sample_s,
        # the best a stop can cost: the quickest start and the cheapest storage
        start_s=world.start_s[0], storage_dph=world.storage_price_range[0] * world.disk_gb,
        # the simulated fleet changes only at ticks, and bills from them: so do the oracles
        tick_s=config.sim.seconds_per_tick,
    )  # fmt: skip


def _placed(tasks: list[TraceTask], params: BaselineParams) -> Outcome:
    """The oracle with stop and start where no task moves: fleetgate's own actions, on the
    other oracles' machines (a Curio task runs on the node that claimed it until it ends)."""
    count = params.max_instances
    if count is None:
        count = math.ceil(baselines.peak_concurrency(tasks, params.horizon_s) / params.slots)
    same = market.identical(params, count)
    return market.market_oracle(tasks, params, same, moves=False, name="oracle_placed")


def _market(sim: Simulation, params: BaselineParams) -> list[market.Level]:
    """The market oracle's machines: the world's, less those foreign instances hold."""
    world = sim.world
    return market.levels(world.machines.values(), reference_rate=world.config.reference_rate,
                         disk_gb=world.config.disk_gb, held=world.busy_machines(),
                         cap=params.max_instances)  # fmt: skip


def _meta(args: argparse.Namespace, scales: tuple[float, float], tasks: list[TraceTask],
          ticks: int, seed: int, run: FleetgateRun) -> dict[str, Any]:  # fmt: skip
    step = run.seconds_per_tick
    cols = _columns(args)
    return {
        "config": args.simulate_config or args.config,
        "shape": args.shape,
        "trace": {"path": str(args.trace) if args.trace else None,
                  "format": trace_format(args.trace, args.trace_format) if args.trace else None,
                  "arrival_col": cols.arrival, "end_col": cols.end,
                  "service_col": cols.service, "gpu_col": cols.gpu,
                  "time_scale": scales[0], "service_scale": scales[1],
                  "min_service_s": args.min_service_s, "max_service_s": args.max_service_s,
                  "time_format": args.time_format, "tz": args.tz,
                  "where": list(args.where)},  # fmt: skip
        "tasks": len(tasks), "ticks": ticks, "seconds_per_tick": step, "seed": seed,
        "horizon_s": ticks * step, "days": ticks * step / DAY, "deadline_s": args.deadline_s,
        "answer_after_s": args.answer_after_s,
        "ticks_per_s": round(ticks / run.wall_s, 1) if run.wall_s > 0 else None,
    }  # fmt: skip


def _title(args: argparse.Namespace, meta: dict[str, Any]) -> str:
    name = Path(args.trace).name if args.trace else f"shape {args.shape}"
    return (f"fleetgate simulate: {name}, {meta['tasks']} tasks, "
            f"{meta['days']:.1f} days")  # fmt: skip


def _run_doc(run: FleetgateRun) -> dict[str, Any]:
    sim = run.sim
    return {**run.journal, "answers": run.answers, "instance_hours_by_state": run.hours_by_state,
            "tasks_arrived": sim["tasks_arrived"], "tasks_completed": sim["tasks_completed"],
            "tasks_released": sim["tasks_released"],
            "instances_destroyed": sim["instances_destroyed"],
            "avg_dph": round(run.outcome.dph, 4)}  # fmt: skip
