"""Parameters and results in one line, as the console, the log and the commands show them:
`key=value` pairs, a list as its items joined by commas (`launched=10001,10002`), an empty one
as `none`, an empty text as `""`. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def brief(d: Mapping[str, Any] | None) -> str:
    return " ".join(f"{k}={_value(v)}" for k, v in (d or {}).items())


def _value(v: Any) -> str:
    if isinstance(v, list | tuple):
        return ",".join(map(str, v)) or "none"
    if v == "":  # `reason=` read as a value cut off
        return '""'
    return str(v)
