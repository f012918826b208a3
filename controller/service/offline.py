"""The commands that need only the journal: status, actions, escalations list and show, pause
and resume (the emergency brake).

They must work while the running controller keeps acting, whatever is wrong on disk: rules
that do not load, a secret whose environment variable is unset, a config section with an
error. So they never read the rules into an engine, never build a channel, an LLM client or a
fleet:

1. load the config, resolving the secrets that resolve; one that does not is noted, not fatal
   (unless it is the journal's own DSN, without which there is no journal to read); a
   top-level section with an error is noted and left out (unless it says where the journal is);
2. open the journal that exists: the SQLite file in the state directory (read-only for the
   read commands) or the configured PostgreSQL schema. No journal at the path is an error
   (`no journal at PATH`), never a new empty one: a command run in the wrong directory says
   so instead of pausing a journal no controller reads;
3. say on stderr, one line each, what `run` and `tick` would refuse to start on: the config's
   secret, the rules' first problem.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import SecretStr, ValidationError

from controller import textfile
from controller.core.brief import brief
from controller.core.fields import RESOLVER
from controller.rules.rulebook import RulesError
from controller.rules.source import read_rulebook
from controller.rules.yamlsrc import Located, load
from controller.service import status
from controller.service.config import (
    Config,
    ConfigError,
    load_config,
    rules_paths,
    secret_resolver,
    state_dir,
)
from controller.service.secrets import SecretError
from controller.store.journal import Journal

COMMANDS = ("status", "actions", "pause", "resume")  # with `escalations list|show`
PLACEHOLDER = "https://unresolved.invalid"  # stands in for a secret that did not resolve


class NoJournal(Exception):
    """There is no journal where the config and --state point."""


@dataclass
class Offline:
    """The config as far as it loads, the journal, and what is wrong (one line each)."""

    config: Config
    state: Path
    journal: Journal
    problems: list[str] = field(default_factory=list)


def wants_offline(command: str, esc_command: str | None) -> bool:
    return command in COMMANDS or (command == "escalations" and esc_command in ("list", "show"))


def lenient_config(path: str | None) -> tuple[Config, list[str]]:
    """The config; a secret that does not resolve stands in as a placeholder, and a top-level
    section with an error is left out (its defaults stand), each named in the problems: the
    brake (`pause`) and `status` must work after a bad edit to a live config, whose controller
    goes on with the config it loaded. The sections that say where the journal is
    (`JOURNAL_KEYS`) are never left out: with an error there, or in the file as a whole (YAML
    that does not parse), the strict loader's `ConfigError`."""
    try:
        return load_config(path), []
    except ConfigError as strict:
        missing: list[str] = []
        dropped: list[str] = []
        config = _with_placeholders(path, missing, dropped)
        if config is None or not (missing or dropped):
            raise
        lines = str(strict).splitlines()
        more = f" (and {len(lines) - 1} more: `fleetgate check`)" if len(lines) > 1 else ""
        return config, [lines[0] + more]


JOURNAL_KEYS = frozenset({"state_dir", "journal"})


def _with_placeholders(path: str | None, missing: list[str], dropped: list[str]) -> Config | None:
    resolve = secret_resolver()

    def tolerant(value: object) -> SecretStr:
        try:
            return resolve(value)
        except SecretError as exc:
            missing.append(str(exc))
            return SecretStr(PLACEHOLDER)

    try:
        doc = load(textfile.read_text(str(path))) or Located()
    except Exception:  # noqa: BLE001 - any other problem: the strict error stands
        return None
    if not isinstance(doc, dict):
        return None
    for _ in range(len(doc) + 1):
        missing.clear()
        try:
            return Config.model_validate(doc, context={RESOLVER: tolerant})
        except ValidationError as exc:
            errors = exc.errors()
            bad = {str(e["loc"][0]) for e in errors if e["loc"]}
            if any(not e["loc"] for e in errors) or bad & JOURNAL_KEYS or not bad <= set(doc):
                return None  # an error of the whole, or where the journal is: it stands
            kept = Located((k, v) for k, v in doc.items() if k not in bad)
            kept.line, kept.key_lines = getattr(doc, "line", 0), getattr(doc, "key_lines", {})
            doc = kept
            dropped += sorted(bad)
        except Exception:  # noqa: BLE001 - any other problem: the strict error stands
            return None
    return None


def rules_problem(config: Config) -> str | None:
    """The first problem of the rules `run` would load (None when they load)."""
    paths = rules_paths(config)
    absent = [p for p in paths if not p.exists()]
    if absent:
        from controller.service.assemble import RULES_HINT

        return f"rules: {str(absent[0])!r} is neither a rules file nor a folder{RULES_HINT}"
    try:
        read_rulebook(paths, config.settings)  # as `run` reads them: with the config's values
    except RulesError as exc:
        lines = str(exc).splitlines()
        more = f" (and {len(lines) - 1} more: `fleetgate check`)" if len(lines) > 1 else ""
        return f"rules: {lines[0].strip()}{more}"
    return None


@contextmanager
def opened(config_path: str | None, state_arg: str | None, *, write: bool) -> Iterator[Offline]:
    """Steps 1 to 3; the journal is closed on leaving."""
    config, problems = lenient_config(config_path)
    state = state_dir(config, state_arg)
    _existing_journal(config, state, problems)
    from controller.service.assemble import open_journal

    journal = open_journal(config, state, read_only=not write, person=True)
    try:
        if mismatch := provider_problem(config, journal):
            problems.append(mismatch)
        rules = rules_problem(config)
        for line in [*problems, *([rules] if rules else [])]:
            print(f"fleetgate: warning: {line}; `run` and `tick` refuse to start", file=sys.stderr)
        yield Offline(config, state, journal, problems + ([rules] if rules else []))
    finally:
        journal.close()


def provider_problem(config: Config, journal: Journal) -> str | None:
    """The line that says the journal records another provider's fleet than the config's (a
    forgotten --config is the simulator), or None."""
    from controller.service.assemble import PROVIDER_KEY

    noted = journal.meta.get(PROVIDER_KEY)
    if noted is None or noted == config.provider:
        return None
    return (f"provider: the journal records the fleet of provider {noted!r}, and the config's "
            f"provider is {config.provider!r} (see --config)")  # fmt: skip


def answering_config(config_path: str | None, state_arg: str | None) -> Config:
    """`escalations approve|deny`: the config as far as its secrets resolve, over a journal that
    exists. An answer is journaled for the running controller to act on; it sends nothing and
    calls no provider, so a secret only `run` uses (kept from the person at the terminal, say,
    in the service's environment file) is named on stderr, not fatal."""
    config, problems = lenient_config(config_path)
    _existing_journal(config, state_dir(config, state_arg), problems)
    for line in problems:
        print(f"fleetgate: warning: {line}; `run` and `tick` refuse to start", file=sys.stderr)
    return config


def _existing_journal(config: Config, state: Path, problems: list[str]) -> None:
    """NoJournal unless the journal the config and state name exists (never creates one)."""
    if config.journal is not None and config.journal.dsn.get_secret_value() == PLACEHOLDER:
        raise ConfigError(f"{problems[0]} (the journal's DSN: nothing to read)")
    if config.journal is None and not (state / "journal.db").is_file():
        raise NoJournal(f"no journal at {state / 'journal.db'} (see --state, --config)")
    if config.journal is not None:
        from controller.store.backend import PostgresStore

        pg = config.journal
        dsn = pg.dsn.get_secret_value()
        if not PostgresStore.holds_journal(dsn, pg.schema_name, pg.connect_timeout_s):
            where = PostgresStore.where_of(dsn, pg.schema_name)
            raise NoJournal(f"no journal in {where} (see --config)")


def status_doc(off: Offline) -> dict[str, Any]:
    """What `fleetgate status` shows, from the journal alone (`controller.service.status`),
    with the rules digest the last tick ran and what is broken."""
    from controller.service.assemble import PROVIDER_KEY

    j = off.journal
    last = j.meta.ticks(1)
    sim = _saved_sim(j)
    now = sim.now() if sim is not None else (j.meta.last_now() or 0.0)
    doc = status.status_doc(
        j, now=now, provider=j.meta.get(PROVIDER_KEY) or off.config.provider,
        paused=off.config.guards.paused,
        rules=last[0].get("rules") if last else None, ttl_s=off.config.lease.ttl_s,
        sim=sim.stats if sim is not None else None,
    )  # fmt: skip
    return {**doc, "problems": off.problems}


def _saved_sim(journal: Journal) -> Any:
    from controller.service.assemble import SIM_KEY
    from controller.sim import Simulation

    saved = journal.meta.get(SIM_KEY)
    return Simulation.from_json(saved) if saved is not None else None


def escalation_doc(journal: Journal, esc_id: int) -> dict[str, Any] | None:
    """One escalation with its deliveries, LLM calls, actions and outbox jobs."""
    from controller.store.outbox import OutboxStore

    esc = journal.escalations.escalation(esc_id)
    if esc is None:
        return None
    esc["deliveries"] = journal.escalations.deliveries(esc_id)
    esc["llm_calls"] = journal.llm.llm_calls(esc_id)
    esc["actions"] = journal.actions.actions_for_escalation(esc_id)
    esc["outbox"] = OutboxStore(journal.store).jobs(esc_id)  # what came of each job
    return esc


def _action_words(action: Any) -> str:
    """An action as `name key=value ...` (a default action, an approved answer)."""
    if isinstance(action, dict) and action.get("action"):
        return f"{action['action']} {brief(action.get('params') or {})}".rstrip()
    return str(action)


def _answer_words(esc: dict[str, Any]) -> str:
    """What the answer was: the action it approved, the note that closed it, or what its
    status says when it carries none (a denial; a deadline, after which the default ran)."""
    answer = esc.get("answer")
    if isinstance(answer, dict) and answer.get("action"):
        overrides = answer.get("override")
        return _action_words(answer) + (f" (overriding {', '.join(overrides)})"
                                        if overrides else "")  # fmt: skip
    if isinstance(answer, dict) and answer.get("note"):
        return str(answer["note"])
    if answer:
        return brief(answer) if isinstance(answer, dict) else str(answer)
    return {
        "expired": "none before the deadline (the default action applies)",
        "denied": "denied",
    }.get(str(esc.get("status")), "-")


def render_escalation(esc: dict[str, Any], ts: Callable[[float | None], str]) -> list[str]:
    """`escalations show ID` as text: the escalation, then its trail."""
    out = [
        f"escalation #{esc['id']} {esc['status']}: {esc['kind']} {esc['subject']}",
        f"  {esc['summary']}",
        f"  raised {ts(esc['created_at'])}, deadline {ts(esc['deadline'])}, "
        f"default {_action_words(esc['default_action'])}",
    ]
    if esc.get("answered_by"):
        out.append(f"  answered by {esc['answered_by']} at {ts(esc.get('answered_at'))}: "
                   f"{_answer_words(esc)}")  # fmt: skip
    for d in esc["deliveries"]:
        out.append(f"  delivery {ts(d['at'])} {d['channel']}: {'ok' if d['ok'] else 'failed'}"
                   + (f" ({d['detail']})" if d.get("detail") else ""))  # fmt: skip
    for c in esc["llm_calls"]:
        why = c.get("rationale") or c.get("error") or ""
        conf = c.get("confidence")  # none when the call gave no answer (down, over budget)
        sure = f" (confidence {conf:.2f})" if isinstance(conf, int | float) else ""
        out.append(f"  llm {ts(c['at'])} {c['model']} {c['status']}: {c.get('action') or '-'}"
                   f"{sure} {why}")  # fmt: skip
    for a in esc["actions"]:
        out.append(f"  action #{a['id']} {ts(a['at'])} {a['verdict']} {a['status']} "
                   f"{a['action']} {a['target']}: {a['why']}")  # fmt: skip
    for job in esc["outbox"]:
        out.append(f"  outbox {job['kind']}: {job.get('outcome') or 'waiting'} after "
                   f"{job['attempts']} attempt(s)")  # fmt: skip
    out.append("  (--json for every field, the situation included)")
    return out
