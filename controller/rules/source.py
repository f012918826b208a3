"""Rules files on disk → a rulebook and its engine. Keeps the last good rules in force.

The I/O half of `rulebook` (which is pure): which files a path means, reading them, and
swapping in a new engine only when every file is valid and durable_rules accepts it.

`read_rulebook` has every new `matches` pattern compiled first in a child process
(`controller.rules.trial`): one durable_rules refuses, crashes or dwells on is a `path:line`
problem, never a dead controller or a stalled tick.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from controller import textfile
from controller.rules.engine import Engine
from controller.rules.limits import show
from controller.rules.rulebook import Problem, Rulebook, RulesError, load_texts
from controller.rules.trial import pattern_problems

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


def shipped_rules() -> Path:
    """The rules fleetgate ships: `controller/shipped_rules`, installed with the package (in
    a source tree, a link to the repository's `rules/`)."""
    return Path(__file__).resolve().parents[1] / "shipped_rules"


def _named(paths: Sequence[Path]) -> list[tuple[str, Path]]:
    """Each rules file with the name the digest knows it by: its path below the folder named,
    or its own name when named itself (so `rules`, `./rules/` and `/srv/x/rules` agree)."""
    out: list[tuple[str, Path]] = []
    for p in paths:
        for f in rule_files([p]):
            out.append((f.name if f == p else f.relative_to(p).as_posix(), f))
    return out


def contents_digest(texts: Sequence[tuple[str, str]]) -> str:
    """The rules' identity: a digest of (name, text) pairs, however the paths were spelt."""
    digest = hashlib.sha256()
    for name, text in texts:
        digest.update(name.encode() + b"\0" + text.encode() + b"\0")
    return digest.hexdigest()[:12]


def read_rulebook(
    paths: Sequence[Path],
    settings: Mapping[str, Any] | None = None,
    origin: str = "the config's settings",
) -> Rulebook:
    """Read and validate; raise RulesError with `path:line` problems. The digest is of the
    files' names (relative to the folders named) and contents (`contents_digest`). `settings`
    override the files' own (`controller.rules.settings`; `origin` names them in errors)."""
    texts = []
    problems = []
    named = _named(paths)
    files = [f for _, f in named]
    if not files:
        where = ", ".join(str(p) for p in paths) or "(none)"
        raise RulesError([Problem(where, 0, "no rules files found")])
    for f in files:
        try:
            texts.append((str(f), textfile.read_text(f)))
        except OSError as exc:
            problems.append(Problem(str(f), 0, f"cannot read: {textfile.unreadable(exc)}"))
        except UnicodeDecodeError as exc:
            problems.append(
                Problem(
                    str(f), 0, f"cannot read: not UTF-8 text ({exc.reason} at byte {exc.start})"
                )
            )
    if problems:
        raise RulesError(problems)
    book = load_texts(texts, settings, origin)
    problems = pattern_problems(book)
    if problems:
        raise RulesError(problems)
    names = [name for name, _ in named]
    pairs = [(n, t) for n, (_, t) in zip(names, texts, strict=True)]
    return replace(book, digest=contents_digest(pairs))


def _engine(book: Rulebook, where: str) -> Engine:
    """The engine for `book`; anything durable_rules refuses is a RulesError."""
    try:
        return Engine(book)
    except Exception as exc:  # EngineError, or whatever else the C extension raises
        raise RulesError([Problem(where, 0, f"the rule engine refused the rules: {exc}")]) from exc


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

    def __init__(self, paths: Sequence[Path], check_every_s: float = 0.0,
                 settings: Mapping[str, Any] | None = None) -> None:  # fmt: skip
        """`settings`: the config's, over the rules files' own."""
        self.paths = list(paths)
        self.settings = dict(settings or {})
        self.book = read_rulebook(self.paths, self.settings)
        self.engine = _engine(self.book, self._where())
        self._seen = _files_digest(self.paths)
        self._failed = False  # the last reload failed (the journal's last word is a failure)
        self.check_every_s = check_every_s  # wall-clock seconds between looks at the files
        self._looked_at = time.monotonic()

    def _where(self) -> str:
        return ", ".join(str(p) for p in self.paths) or "(no rules paths)"

    def use_settings(self, settings: Mapping[str, Any]) -> None:
        """The config's settings changed (SIGHUP): the next `reload()` reads the rules with
        them, as conditions compare with the values their book was built with."""
        self.settings = dict(settings)
        self.force()

    def force(self) -> None:
        """Read the files again on the next `reload()`, changed or not (SIGHUP)."""
        self._seen = ""

    def changed(self) -> bool:
        """Did any rules file change (name, size, mtime) since the last look?"""
        return _files_digest(self.paths) != self._seen

    def reload(self) -> Reload | None:
        """Read the files again if they changed. None: nothing changed. A bad edit (or rules the
        engine refuses) is reported with its problems and the last good rules stay in force."""
        recent = time.monotonic() - self._looked_at < self.check_every_s
        if self.check_every_s > 0 and self._seen and recent:
            return None  # looked less than check_every_s ago (a replay ticks ~1,000 times a s)
        self._looked_at = time.monotonic()
        if not self.changed():
            return None
        self._seen = _files_digest(self.paths)
        try:
            self._check_not_emptied()
            book = read_rulebook(self.paths, self.settings)
            if book.digest == self.book.digest and book.settings == self.book.settings:
                return self._back_in_force()  # touched, not changed; or a bad edit undone
            engine = _engine(book, self._where())
        except RulesError as exc:
            log.error("rules reload failed; the last good rules (%s) stay in force:\n%s",
                      self.book.digest, exc)  # fmt: skip
            self._failed = True
            return Reload(False, self.book.digest, self._seen, str(exc))
        except Exception as exc:  # noqa: BLE001 - the files are input: a failed reload, never a failed tick
            log.exception("rules reload failed; the last good rules (%s) stay in force",
                          self.book.digest)  # fmt: skip
            why = show(str(exc))
            self._failed = True
            return Reload(False, self.book.digest, self._seen,
                          f"{self._where()}: the rules could not be read: "
                          f"{type(exc).__name__}: {why}")  # fmt: skip
        self.book, self.engine, self._failed = book, engine, False
        log.info("rules reloaded: %s (%d rules)", book.digest, len(book.rules))
        return Reload(True, book.digest, book.digest)

    def _back_in_force(self) -> Reload | None:
        """The files read as the rules in force. After a failed reload that is news (the edit
        was undone: the journal's last reload must not stay a failure); else nothing changed."""
        if not self._failed:
            return None
        self._failed = False
        log.info("rules files read as the rules in force again (%s, %d rules): the failed "
                 "edit is undone", self.book.digest, len(self.book.rules))  # fmt: skip
        return Reload(True, self.book.digest, self.book.digest)

    def _check_not_emptied(self) -> None:
        """A file whose rules are in force and that is now empty is a save caught half way (an
        editor truncates, then writes), not rules withdrawn: loading it would drop its rules
        for a tick. Deleting the file is how its rules are withdrawn."""
        held = {rule.path for rule in self.book.rules}
        problems = []
        for f in rule_files(self.paths):
            try:
                empty = str(f) in held and f.stat().st_size == 0
            except OSError:
                continue  # missing: read_rulebook says so
            if empty:
                why = (
                    "is empty, but rules from it are in force (a save under way?); the "
                    "last good rules stay until it holds rules again; delete the file to "
                    "drop its rules"
                )
                problems.append(Problem(str(f), 0, why))
        if problems:
            raise RulesError(problems)
