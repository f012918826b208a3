"""`push-logs`: the new complete lines of a log file, pushed to the controller in batches.

`Tailer` remembers how far it got (in a state file, across restarts), starts a first pass near
the end of the file, and starts again at the beginning after a truncation or a rotation.

Standard library only: this package is copied onto instance images.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass

from .client import MAX_READ_BYTES, Client

MAX_PUSH_LINES = 200  # the controller's cap per push
MAX_LINE_CHARS = 2000
TAIL_START_BYTES = 256 * 1024  # a first push-logs starts this far before the end of the file

log = logging.getLogger("fleetgate-agent")


@dataclass
class Tailer:
    """New complete lines of a file since the last pass; survives truncation and rotation."""

    path: str
    state_path: str | None = None
    offset: int | None = None
    inode: int | None = None

    def __post_init__(self) -> None:
        if self.state_path and os.path.exists(self.state_path):
            try:
                with open(self.state_path, encoding="utf-8") as f:
                    saved = json.load(f)
                self.offset, self.inode = int(saved["offset"]), int(saved["inode"])
            except (OSError, ValueError, KeyError, TypeError):
                log.warning("ignoring unreadable state file %s", self.state_path)

    def read(self) -> list[tuple[str, int]]:
        """[(line, offset after it)]: up to MAX_READ_BYTES of new complete lines."""
        st = os.stat(self.path)
        mid_line = False
        if self.offset is None or self.inode != st.st_ino or st.st_size < self.offset:
            first = self.offset is None  # start near the end; after a rotation, at the start
            self.offset = max(0, st.st_size - TAIL_START_BYTES) if first else 0
            self.inode, mid_line = st.st_ino, first and self.offset > 0
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read(MAX_READ_BYTES)
        end = data.rfind(b"\n")
        if end < 0 and len(data) < MAX_READ_BYTES:
            return []  # an unfinished line: wait for its end
        chunks = data[:end].split(b"\n") if end >= 0 else [data]  # else: one enormous line
        out, pos = [], self.offset
        for chunk in chunks:
            pos = min(pos + len(chunk) + 1, self.offset + len(data))
            out.append((chunk.decode("utf-8", "replace")[:MAX_LINE_CHARS], pos))
        if mid_line:  # the first "line" is the end of one that started before the window
            self.commit(out.pop(0)[1])
        return out

    def commit(self, offset: int) -> None:
        self.offset = offset
        if self.state_path:
            tmp = self.state_path + ".tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump({"offset": offset, "inode": self.inode}, f)
            os.replace(tmp, self.state_path)


def push_new_lines(client: Client, tailer: Tailer) -> int:
    """Push what is new in batches; the offset moves past a batch once the controller has it."""
    try:
        lines = tailer.read()
    except FileNotFoundError:
        log.info("%s does not exist yet", tailer.path)
        return 0
    for start in range(0, len(lines), MAX_PUSH_LINES):
        batch = lines[start : start + MAX_PUSH_LINES]
        client.post(client.instance_path("logs"), {"lines": [text for text, _ in batch]})
        tailer.commit(batch[-1][1])
    return len(lines)
