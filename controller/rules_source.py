"""Rules files on disk → a rulebook and its engine. Keeps the last good rules in force.

The I/O half of `rulebook` (which is pure): which files a path means, reading them, and
swapping in a new engine only when every file is valid.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from controller.engine import Engine
from controller.rulebook import Problem, Rulebook, RulesError, load_texts

log = logging.getLogger(__name__)


def rule_files(paths: Sequence[Path]) -> list[Path]:
    """Files named, plus the *.yaml / *.yml directly inside folders named (not sub-folders:
    `rules/tests/` holds rule unit tests, not rules)."""
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            out += sorted(f for f in p.iterdir() if f.suffix in (".yaml", ".yml") and f.is_file())
        else:
            out.append(p)
    return out


def read_rulebook(paths: Sequence[Path]) -> Rulebook:
    """Read and validate; raise RulesError with `path:line` problems."""
    texts = []
    problems = []
    files = rule_files(paths)
    if not files:
        where = ", ".join(str(p) for p in paths) or "(none)"
        raise RulesError([Problem(where, 0, "no rules files found")])
    for f in files:
        try:
            texts.append((str(f), f.read_text(encoding="utf-8")))
        except OSError as exc:
            problems.append(Problem(str(f), 0, f"cannot read: {exc.strerror}"))
        except UnicodeDecodeError as exc:
            problems.append(
                Problem(
                    str(f), 0, f"cannot read: not UTF-8 text ({exc.reason} at byte {exc.start})"
                )
            )
    if problems:
        raise RulesError(problems)
    return load_texts(texts)


@dataclass(frozen=True)
class Reload:
    """What a reload found: new rules in force, or a bad edit (the old rules stay)."""

    ok: bool
    digest: str  # of the rules in force afterwards
    tried: str  # of the files as read (equal to digest when ok)
    problems: str = ""


def _files_digest(paths: Sequence[Path]) -> str:
    """A cheap fingerprint of the files' names, sizes and mtimes (no parsing)."""
    parts = []
    for f in rule_files(paths):
        try:
            st = f.stat()
        except OSError:
            parts.append(f"{f}:missing")
            continue
        parts.append(f"{f}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


class RulesSource:
    """The rules in force. `reload()` swaps them only when the new files are all valid."""

    def __init__(self, paths: Sequence[Path], check_every_s: float = 0.0) -> None:
        self.paths = list(paths)
        self.book = read_rulebook(self.paths)
        self.engine = Engine(self.book)
        self._seen = _files_digest(self.paths)
        self.check_every_s = check_every_s  # wall-clock seconds between looks at the files
        self._looked_at = time.monotonic()

    def force(self) -> None:
        """Read the files again on the next `reload()`, changed or not (SIGHUP)."""
        self._seen = ""

    def changed(self) -> bool:
        """Did any rules file change (name, size, mtime) since the last look?"""
        return _files_digest(self.paths) != self._seen

    def reload(self) -> Reload | None:
        """Read the files again if they changed. None: nothing changed. A bad edit is reported
        with `path:line` problems and the last good rules stay in force."""
        recent = time.monotonic() - self._looked_at < self.check_every_s
        if self.check_every_s > 0 and self._seen and recent:
            return None  # looked less than check_every_s ago (a replay ticks ~1,000 times a s)
        self._looked_at = time.monotonic()
        if not self.changed():
            return None
        self._seen = _files_digest(self.paths)
        try:
            book = read_rulebook(self.paths)
        except RulesError as exc:
            log.error("rules reload failed; the last good rules (%s) stay in force:\n%s",
                      self.book.digest, exc)  # fmt: skip
            return Reload(False, self.book.digest, self._seen, str(exc))
        if book.digest == self.book.digest:
            return None  # touched, not changed
        self.book, self.engine = book, Engine(book)
        log.info("rules reloaded: %s (%d rules)", book.digest, len(book.rules))
        return Reload(True, book.digest, book.digest)
