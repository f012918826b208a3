"""Run the fault-injection scenarios and print a table.

    .venv/bin/python tests/reliability/run_chaos.py           # CI sizes
    .venv/bin/python tests/reliability/run_chaos.py --full    # 1,000 faults/files, 200 answers

Exit status 1 when any harm counter is nonzero (its details are printed).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parents[1])]

from reliability import chaos  # noqa: E402

SIZES = {
    "ci": {"provider_faults": 60, "fuzzed_rules": 100, "adversarial_llm": 30},
    "full": {"provider_faults": 1000, "fuzzed_rules": 1000, "adversarial_llm": 200},
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="the full counts")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    sizes = SIZES["full" if args.full else "ci"]
    rows, harmed = [], []
    for name in ("provider_faults", "fuzzed_rules", "adversarial_llm", "secrets_scan"):
        start = time.monotonic()
        if name == "secrets_scan":
            count, result = 1, chaos.secrets_scan()
        else:
            count = sizes[name]
            result = getattr(chaos, name)(count, args.seed)
        wall = time.monotonic() - start
        harms = {k: result[k] for k in chaos.HARMS[name]}
        stats = {k: v for k, v in result.items() if k not in harms and k != "details"}
        rows.append((name, str(count), _kv(harms), _kv(stats), f"{wall:.1f}"))
        if any(harms.values()):
            harmed.append((name, result["details"]))
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
