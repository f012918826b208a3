"""`simulate.png`: queue, fleet and cumulative spend over the run, fleetgate beside the baselines.

Three panels sharing the time axis (days from the trace start):

1. tasks waiting in the queue: fleetgate, static, both proportional baselines (the oracle
   never queues);
2. fleetgate's fleet by state (booting, serving, lost or rebooting) stacked, with the
   baselines' fleet sizes as lines;
3. cumulative spend of every policy (on a log scale when one costs over 5 times another).

Drawn with matplotlib's Agg canvas directly (no pyplot state, no display needed). matplotlib
is optional (`pip install 'fleetgate[simulate]'`): without it `draw` writes nothing and says so
in one line; the report and the table do not need it.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from controller.tools.replay.results import Outcome, label

MISSING = "no chart: matplotlib is not installed (pip install 'fleetgate[simulate]')"

COLORS = {"fleetgate": "#1f77b4", "static": "#7f7f7f", "proportional": "#ff7f0e",
          "proportional_sim": "#9467bd", "oracle": "#2ca02c",
          "oracle_warm": "#98df8a", "oracle_market": "#17becf",
          "oracle_placed": "#bcbd22"}  # fmt: skip
DAY = 86400.0


def available() -> bool:
    """Does matplotlib import here?"""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def draw(path: Path, outcomes: Sequence[Outcome], title: str,
         say: TextIO | None = None) -> Path | None:  # fmt: skip
    """Write the chart to `path` (PNG) and return it; None (and one line on `say`, default
    stderr) when matplotlib is not installed."""
    if not available():
        print(f"fleetgate simulate: {MISSING}", file=say or sys.stderr)
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    by_name = {o.name: o for o in outcomes}
    fig = Figure(figsize=(11, 10), layout="constrained")
    FigureCanvasAgg(fig)
    queue, fleet, spend = fig.subplots(3, 1, sharex=True)
    fig.suptitle(title)

    for name in ("fleetgate", "static", "proportional", "proportional_sim"):
        if name in by_name:
            s = by_name[name].series
            queue.plot([x.t / DAY for x in s], [x.queued for x in s], label=label(name),
                       color=COLORS[name], linewidth=0.9)  # fmt: skip
    queue.set_ylabel("tasks waiting")
    queue.legend(loc="upper left")

    if "fleetgate" in by_name:
        s = by_name["fleetgate"].series
        fleet.stackplot(
            [x.t / DAY for x in s],
            [x.booting for x in s], [x.serving for x in s], [x.other for x in s],
            labels=["fleetgate booting", "fleetgate serving", "fleetgate lost/rebooting"],
            colors=["#aec7e8", COLORS["fleetgate"], "#d62728"], alpha=0.8,
        )  # fmt: skip
    for name in ("static", "proportional", "proportional_sim", "oracle"):
        if name in by_name:
            s = by_name[name].series
            fleet.plot([x.t / DAY for x in s], [x.booting + x.serving for x in s],
                       label=f"{label(name)} instances", color=COLORS[name], linewidth=0.7,
                       alpha=0.7)  # fmt: skip
    fleet.set_ylabel("instances")
    fleet.legend(loc="upper left", fontsize="small")

    for o in outcomes:
        name = f"{label(o.name)} (${o.cost_usd:,.0f})"
        spend.plot([x.t / DAY for x in o.series], [x.spend_usd for x in o.series], label=name,
                   color=COLORS.get(o.name))  # fmt: skip
    finals = [o.cost_usd for o in outcomes if o.cost_usd > 0]
    if finals and max(finals) > 5 * min(finals):  # a static fleet would flatten the others
        spend.set_yscale("symlog", linthresh=1.0)
    spend.set_ylabel("cumulative spend, $")
    spend.set_xlabel("days from the trace start")
    spend.legend(loc="upper left")

    fig.savefig(path, format="png", dpi=110)
    return path
