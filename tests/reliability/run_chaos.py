"""Run the fault-injection scenarios and print a table.

    .venv/bin/python tests/reliability/run_chaos.py           # CI sizes
    .venv/bin/python tests/reliability/run_chaos.py --full    # the full counts
    .venv/bin/python tests/reliability/run_chaos.py --only kill9,failover

Exit status 1 when any harm counter is nonzero (its details are printed).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parents[1])]

from reliability import chaos, failover, kill9  # noqa: E402

SIZES = {
    "ci": {"provider_faults": 60, "fuzzed_rules": 100, "adversarial_llm": 30, "secrets_scan": 1,
           "kill9": 4, "failover": 1, "paused_leader": 1},
    "full": {"provider_faults": 1000, "fuzzed_rules": 1000, "adversarial_llm": 200,
             "secrets_scan": 1, "kill9": 200, "failover": 20, "paused_leader": 20},
}  # fmt: skip
SCENARIOS: dict[str, Callable[[int, int], dict[str, Any]]] = {
    "provider_faults": chaos.provider_faults,
    "fuzzed_rules": chaos.fuzzed_rules,
    "adversarial_llm": chaos.adversarial_llm,
    "secrets_scan": lambda _n, _seed: chaos.secrets_scan(),
    "kill9": kill9.kill9,
    "failover": failover.failover,
    "paused_leader": failover.paused_leader,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="the full counts")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", help=f"comma-separated, of: {', '.join(SCENARIOS)}")
    args = parser.parse_args()
    sizes = SIZES["full" if args.full else "ci"]
    names = args.only.split(",") if args.only else list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)} (expected {', '.join(SCENARIOS)})")
    rows, harmed = [], []
    for name in names:
        start = time.monotonic()
        result = SCENARIOS[name](sizes[name], args.seed)
        wall = time.monotonic() - start
        # a scenario run on several backends reports a row per backend under "rows"
        parts = {f"{name} ({k})": v for k, v in result.get("rows", {}).items()} or {name: result}
        for label, part in parts.items():
            harms = {k: part[k] for k in chaos.HARMS[name]}
            stats = {k: v for k, v in part.items() if k not in harms and k != "details"}
            count = stats.pop("runs", sizes[name])
            share = f"{wall * count / sizes[name]:.1f}" if len(parts) > 1 else f"{wall:.1f}"
            rows.append((label, str(count), _kv(harms), _kv(stats), share))
            if any(harms.values()):
                harmed.append((label, part["details"]))
    head = ("scenario", "count", "harm counters", "statistics", "wall s")
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    for name, details in harmed:
        print(f"\nHARM in {name}:")
        for line in details[:50]:
            print(f"  {line}")
    return 1 if harmed else 0


def _kv(values: dict[str, object]) -> str:
    return ", ".join(f"{k}={v}" for k, v in values.items())


if __name__ == "__main__":
    sys.exit(main())
