"""Durations as operators write them: `90s`, `10m`, `2h`, `1d`, or parts in that order (`1h30m`).

A rule's `for:` and a rule test's `held_for:` take one. A bare number is refused (is `600`
seconds or minutes?), as are zero, fractions and anything over `MAX_S`.

Pure: text in, seconds (or the problem) out.
"""

from __future__ import annotations

import re
from typing import Any

from controller.rules.limits import show

MAX_S = 30 * 86400  # the longest duration a rules file may name (30 days)
_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


def parse_duration(value: Any) -> float:
    """Seconds in `value`; ValueError with a sentence for the operator otherwise."""
    if isinstance(value, bool) or not isinstance(value, str):
        hint = f" (write e.g. {value}s or {value}m)" if isinstance(value, int) and value > 0 else ""
        raise ValueError(f"expects a duration such as 90s, 10m or 2h, got {show(value)}{hint}")
    found = _DURATION.match(value.strip())
    if not value.strip() or found is None:
        raise ValueError(
            f"expects a duration such as 90s, 10m, 2h or 1h30m (units d, h, m, s, largest "
            f"first), got {show(value)}"
        )
    seconds = sum(
        int(n) * unit for n, unit in zip(found.groups(), _UNITS.values(), strict=True) if n
    )
    if seconds <= 0:
        raise ValueError(f"expects a duration above zero, got {show(value)}")
    if seconds > MAX_S:
        raise ValueError(f"expects a duration of at most 30d, got {show(value)}")
    return float(seconds)


def show_duration(seconds: float) -> str:
    """`seconds` the way a rules file writes it (`7m30s`; `0s` for nothing left)."""
    left = max(int(round(seconds)), 0)
    parts: list[str] = []
    for unit, size in _UNITS.items():
        if left >= size or (unit == "s" and not parts):
            n, left = divmod(left, size)
            parts.append(f"{n}{unit}")
    return "".join(parts)
