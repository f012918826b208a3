"""The console channel: the rendered message on a terminal (stdout by default).

Must NOT render, filter or reformat the text; this is the one module allowed to print.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from escalation.channels.base import ChannelError


class ConsoleChannel:
    """Writes each escalation's message to `stream`, or to sys.stdout as it is at send time."""

    def __init__(self, stream: TextIO | None = None, name: str = "console") -> None:
        self.name = name
        self._stream = stream

    def send(self, esc: dict[str, Any], text: str) -> None:
        stream = self._stream if self._stream is not None else sys.stdout
        try:
            print(text, end="" if text.endswith("\n") else "\n", file=stream, flush=True)
        except (OSError, ValueError) as exc:  # ValueError: the stream is closed
            raise ChannelError(
                f"channel {self.name!r}: cannot write escalation {esc.get('id')!r}: {exc}"
            ) from exc
