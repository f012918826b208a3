"""The file channel: one JSON line per escalation appended to a file (JSON Lines).

For tailing, grepping and shipping to a log pipeline. Must NOT rotate, truncate or rewrite the
file, and must NOT hide a write failure: an OSError becomes a ChannelError naming the path.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from escalation.channels.base import ChannelError

# Record field -> key of the escalation dict it comes from ("message" is the rendered text).
_FIELDS = {
    "id": "id",
    "kind": "kind",
    "subject": "subject",
    "fingerprint": "fingerprint",
    "summary": "summary",
    "created_at": "created_at_iso",
    "deadline": "deadline_iso",
    "proposals": "proposals",
    "default_action": "default_action",
}


class FileChannel:
    """Appends `{"id", "kind", ..., "message"}` as one line per escalation to `path`."""

    def __init__(self, path: str | Path, name: str = "file") -> None:
        self.name = name
        self.path = Path(path)

    def send(self, esc: dict[str, Any], text: str) -> None:
        line = self._line(esc, text)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as out:
                out.write(line)
        except OSError as exc:
            raise ChannelError(
                f"channel {self.name!r}: cannot append escalation {esc.get('id')!r}"
                f" to {str(self.path)!r}: {exc}"
            ) from exc

    def _line(self, esc: dict[str, Any], text: str) -> str:
        missing = [key for key in _FIELDS.values() if key not in esc]
        if missing:
            raise ChannelError(
                f"channel {self.name!r}: escalation {esc.get('id')!r} lacks {missing!r}"
            )
        record = {field: esc[key] for field, key in _FIELDS.items()}
        record["message"] = text
        try:
            return json.dumps(record, sort_keys=True, ensure_ascii=False) + "\n"
        except (TypeError, ValueError) as exc:
            raise ChannelError(
                f"channel {self.name!r}: escalation {esc.get('id')!r} is not JSON: {exc}"
            ) from exc
