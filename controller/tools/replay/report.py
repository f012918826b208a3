"""The figures of a simulate run: `report.json` and the table printed on the console.

`build` is pure (results in, a JSON-ready dict out); `render` turns that dict into text;
`write` is the only function that touches a file.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from controller.sim.stats import per_situation_line
from controller.tools.replay.results import BaselineParams, Outcome, label

COST_GOAL = 1.15  # fleetgate's cost at most this many times the oracle's
POLICIES = (
    "fleetgate",
    "static",
    "proportional",
    "proportional_sim",
    "oracle",
    "oracle_warm",
    "oracle_placed",
    "oracle_market",
)
# the other oracles a cost goal is judged against, beside `oracle`, and the suffix of their
# goal keys (`cost_ratio_to_oracle_warm`, `within_cost_goal_warm`, ...)
OTHER_ORACLES = {"oracle_warm": "warm", "oracle_placed": "placed", "oracle_market": "market"}
SCALERS = ("proportional", "proportional_sim")  # the two KEDA-style baselines


def build(
    outcomes: Sequence[Outcome],
    params: BaselineParams,
    *,
    run: dict[str, Any],
    meta: dict[str, Any],
) -> dict[str, Any]:
    """The report: one figures block per policy, fleetgate's journal counts, the goals."""
    by_name = {o.name: o for o in outcomes}
    figures = {o.name: o.figures(params.deadline_s) for o in outcomes}
    oracle_cost = by_name["oracle"].cost_usd
    for name, fig in figures.items():
        cost = by_name[name].cost_usd
        fig["ratio_to_oracle"] = round(cost / oracle_cost, 3) if oracle_cost > 0 else None
        for other in OTHER_ORACLES:
            if other in by_name:
                base = by_name[other].cost_usd
                fig[f"ratio_to_{other}"] = round(cost / base, 3) if base > 0 else None
    return {
        **meta,
        "baseline_params": {
            "boot_s": params.boot_s,
            "dph": round(params.dph, 4),
            "slots": params.slots,
            "tasks_per_instance": params.tasks_per_instance,
            "interval_s": params.interval_s,
            "cooldown_s": params.cooldown_s,
            "max_instances": params.max_instances,
            "start_s": params.start_s,
            "storage_dph": round(params.storage_dph, 4),
            "tick_s": params.tick_s,
        },  # fmt: skip
        "policies": figures,
        "fleetgate": run,
        "goals": goals(figures, params.deadline_s),
    }


def goals(figures: dict[str, dict[str, Any]], deadline_s: float) -> dict[str, Any]:
    """The project's two goals, checked against this run's figures."""
    fg = figures["fleetgate"]
    ratio, p95 = fg["ratio_to_oracle"], fg["waits_s"]["p95"]
    out: dict[str, Any] = {
        "cost_ratio_to_oracle": ratio,
        "within_cost_goal": ratio is not None and ratio <= COST_GOAL,
        "p95_within_deadline": p95 <= deadline_s,
    }
    for other, suffix in OTHER_ORACLES.items():
        if f"ratio_to_{other}" in fg:
            x = fg[f"ratio_to_{other}"]
            out[f"cost_ratio_to_oracle_{suffix}"] = x
            out[f"within_cost_goal_{suffix}"] = x is not None and x <= COST_GOAL
    for name in SCALERS:
        if name in figures:
            out[f"below_{name}_cost"] = fg["cost_usd"] < figures[name]["cost_usd"]
            out[f"p95_equal_or_better_than_{name}"] = p95 <= figures[name]["waits_s"]["p95"]
    return out


def _hours(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 3600 else f"{seconds / 3600:.1f} h"


def render(doc: dict[str, Any]) -> str:
    """The console table and the lines under it."""
    deadline = doc["deadline_s"]
    head = (f"{doc['tasks']} tasks over {doc['days']:.2f} days ({doc['ticks']} ticks of "
            f"{doc['seconds_per_tick']:g} s); deadline {deadline:g} s; baselines at "
            f"${doc['baseline_params']['dph']:.4f}/instance-hour")  # fmt: skip
    tick = doc["baseline_params"].get("tick_s")
    if tick:
        head += f"; the oracles change the fleet only at ticks, as fleetgate does ({tick:g} s)"
    lines = [head, "", f"{'policy':<20}{'cost $':>11}{'GPU-h':>10}{'wait p50':>10}{'p95':>9}"
             f"{'max':>9}{'misses':>8}{'x oracle':>10}"]  # fmt: skip
    for name in (n for n in POLICIES if n in doc["policies"]):
        f = doc["policies"][name]
        w = f["waits_s"]
        shown = f"static ({f['instances']})" if name == "static" else label(name)
        ratio = "-" if f["ratio_to_oracle"] is None else f"{f['ratio_to_oracle']:.3f}"
        lines.append(f"{shown:<20}{f['cost_usd']:>11.2f}{f['gpu_hours']:>10.1f}"
                     f"{_hours(w['p50']):>10}{_hours(w['p95']):>9}{_hours(w['max']):>9}"
                     f"{f['deadline_misses']:>8}{ratio:>10}")  # fmt: skip
    fg = doc["fleetgate"]
    acts = ", ".join(f"{k} {v}" for k, v in fg["actions"].items()) or "none"
    kinds = ", ".join(f"{k} {v}" for k, v in fg["escalations_by_kind"].items())
    lines += [
        "",
        f"fleetgate actions: {acts}",
        f"escalations: {fg['escalations']}{f' ({kinds})' if kinds else ''}; "
        f"LLM calls: {fg['llm_calls']}; answers: {_answers(fg['answers'], doc)}",
        per_situation_line(fg["per_situation"]),
        _forecast_line(fg.get("forecast")),
        _faults_line(doc.get("faults")),
        f"wall time: {doc['wall_s']['total']:.1f} s (fleetgate ticks "
        f"{doc['wall_s']['fleetgate']:.1f} s, {doc['ticks_per_s']:.0f} ticks/s)",
        _goal_line(doc["goals"], deadline),
    ]
    return "\n".join(lines)


def _forecast_line(f: dict[str, Any] | None) -> str:
    """The demand forecast's error against what was there one horizon later."""
    if not f or not f.get("n"):
        return "forecast: none scored (no forecast has reached its horizon)"
    mape = "-" if f["mape"] is None else f"{100 * f['mape']:.1f} %"
    naive = "-" if f["naive_mape"] is None else f"{100 * f['naive_mape']:.1f} %"
    return (
        f"forecast (demand one boot time ahead, {f['n']} ticks scored): MAE {f['mae']:.2f} "
        f"tasks, MAPE {mape}; demand-stays-as-now: MAE {f['naive_mae']:.2f}, MAPE {naive}"
    )


def _faults_line(f: dict[str, Any] | None) -> str:
    """What the world's faults cost any policy, which the oracles never pay."""
    if not f or not f.get("task_hazard_per_h"):
        return "faults: none lose a running task in this world (as in the oracles)"
    added = (f"+{100 * f['rework']:.1f} % of this trace's task time in expectation"
             if f["rework"] is not None else "a task of this trace is so long that the time "
             "it takes in expectation is past counting (it would almost never run to its end)"
             )  # fmt: skip
    return (f"faults: a running task is lost at {f['task_hazard_per_h']:g}/h (daemon deaths, "
            f"exits, hosts gone, freezes) and runs again from its start: {added}, whatever the "
            f"policy; the oracles meet no fault")  # fmt: skip


def _answers(answers: dict[str, int], doc: dict[str, Any]) -> str:
    after = doc.get("answer_after_s")
    if after is None:
        return "none (nobody answers; escalations run to their default action)"
    done = ", ".join(f"{k} {v}" for k, v in sorted(answers.items())) or "none needed"
    return f"{done} (replay operator, after {after:g} s)"


def _goal_line(g: dict[str, Any], deadline: float) -> str:
    """Each cost goal (at most COST_GOAL times an oracle, at a p95 within the deadline), then
    each scaler's (cheaper at an equal or better p95)."""
    p95 = g["p95_within_deadline"]
    costs = [f"oracle: {_yes(g['within_cost_goal'] and p95)} ({g['cost_ratio_to_oracle']}x)"]
    for other, suffix in OTHER_ORACLES.items():
        if f"within_cost_goal_{suffix}" in g:
            met = _yes(g[f"within_cost_goal_{suffix}"] and p95)
            costs.append(f"{label(other)}: {met} ({g[f'cost_ratio_to_oracle_{suffix}']}x)")
    scalers = [f"{label(name)}: {_met(g, name)}" for name in SCALERS
               if f"below_{name}_cost" in g]  # fmt: skip
    return (f"goals: cost <= {COST_GOAL}x with p95 <= {deadline:g} s: {'; '.join(costs)}; "
            f"below the proportional baseline's cost at an equal or better p95: "
            f"{'; '.join(scalers)}")  # fmt: skip


def _yes(ok: bool) -> str:
    return "met" if ok else "not met"


def _met(g: dict[str, Any], name: str) -> str:
    return _yes(g[f"below_{name}_cost"] and g[f"p95_equal_or_better_than_{name}"])


def write(directory: Path, doc: dict[str, Any]) -> Path:
    """`report.json` in `directory` (created if needed)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "report.json"
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path
