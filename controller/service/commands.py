"""Bodies of the read-mostly commands: check, test-rules, explain, actions, escalations, status."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from controller.core.brief import brief
from controller.rules.durations import show_duration
from controller.rules.rulebook import RulesError
from controller.rules.ruletest import run_files
from controller.service import llm_reader
from controller.service.app import App
from controller.service.assemble import assemble, lease
from controller.service.config import Config, ConfigError, state_dir, unreachable_links
from controller.service.status import status_lines
from controller.service.tick import Planned
from controller.store.backend import JournalError
from escalation import approvals
from escalation.render import Renderer
from escalation.situation import escape_controls

log = logging.getLogger(__name__)


def ts(t: float | None) -> str:
    """Epoch seconds as `YYYY-MM-DD HH:MM:SS` (UTC); `-` for none."""
    return _ts(t)


def _ts(t: float | None) -> str:
    if t is None:
        return "-"
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S")


def check(args: argparse.Namespace, config: Config) -> int:
    """The controller `run` would build from the (loaded) config and the rules (the given
    paths, else the configured ones), assembled dry: every adapter is constructed, nothing is
    opened or written. Errors as `path:line: key: problem` (rules: `path:line: rule: ...`)."""
    try:
        app = assemble(config, state=state_dir(config, args.state), clock=time.time,
                       sleep=time.sleep, config_path=args.config, rules=args.paths or None,
                       dry=True)  # fmt: skip
    except (ConfigError, RulesError) as exc:
        print(exc, file=sys.stderr)
        return 1
    try:
        book, escalator = app.controller.rules.book, app.controller.escalator
        llm = config.escalation.llm
        for warning in book.warnings:  # conditions that can never match: worth a look, no error
            print(f"warning: {warning}", file=sys.stderr)
        if links := unreachable_links(config):
            print(f"warning: {links}", file=sys.stderr)
        print(f"ok: {len(book.rules)} rules in {len(book.paths)} file(s), digest {book.digest}; "
              f"provider {config.provider}, demand {config.demand}, "
              f"{len(escalator.notifier.channels)} channel(s), "
              f"{f'LLM {llm.model!r}' if llm else 'no LLM'}")  # fmt: skip
        if getattr(args, "connect", False):
            failed = 0
            for line, bad in reach(app):
                failed += bad
                out = sys.stderr if bad else sys.stdout
                print(f"{'failed' if bad else 'ok'}: {line}", file=out)
            if llm is not None:
                print("LLM: not asked here (`fleetgate llm-check` asks it)")
            return 1 if failed else 0
    finally:
        app.close()
    return 0


def reach(app: App) -> list[tuple[str, bool]]:
    """`check --connect`: one read of vast's listing and one of Curio's queue, as the
    controller's first tick makes them (nothing written, nothing rented); (line, failed)."""
    from controller.fleet.base import ProviderError, SensorError

    out: list[tuple[str, bool]] = []
    vast = getattr(app.controller.provider, "vast", None)
    if vast is None or app.config.provider == "sim":
        out.append(("provider: the built-in simulator, nothing to reach", False))
    else:
        try:
            listed = vast.list_instances(expect_nonempty=False)
            out.append((f"vast answered: {len(listed)} instance(s) on the account", False))
        except (SensorError, ProviderError) as exc:
            out.append((f"vast: {exc}", True))
    settings = getattr(app.controller.demand, "settings", None)
    if settings is None or not hasattr(settings, "dsn") or app.config.demand == "sim":
        out.append(("demand: the built-in simulator, nothing to reach", False))
    else:
        try:
            queue = app.controller.demand.demand()
            total = next((d for d in queue if d.task == "all"), None)
            pending = total.pending if total is not None else 0
            out.append((f"Curio answered: {pending} task(s) pending in schema "
                        f"{settings.schema_name!r}", False))  # fmt: skip
        except SensorError as exc:
            out.append((f"Curio: {exc}", True))
    return out


def test_rules(paths: Sequence[str]) -> int:
    results = run_files([Path(p) for p in paths])
    failed = [r for r in results if not r.ok]
    for r in results:
        print(f"{'PASS' if r.ok else 'FAIL'} {r.where}: {r.name}")
        for line in r.problems:
            print(f"    {line}")
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed or not results else 0


def explain_doc(p: Planned) -> dict[str, Any]:
    return {
        "now": p.now,
        "facts": p.facts,
        "matches": [
            {"rule": m.rule, "abnormal": m.abnormal_kind, "facts": m.facts} for m in p.matches
        ],
        "plan": [
            {
                "verdict": d.verdict,
                "action": d.effective_action,
                "params": d.effective_params,
                "proposer": d.proposal.proposer,
                "confidence": d.proposal.confidence,
                "why": d.why,
                "guard": d.guard,
            }
            for d in p.plan.decisions
        ],
        "escalations": [
            {"kind": d.kind, "subject": d.subject, "summary": d.summary} for d in p.doubts
        ],
        "unmatched": list(p.decided.unmatched),
        "pending": [
            {
                "rule": w.rule,
                "subject": w.subject,
                "since": w.since,
                "for_s": w.for_s,
                "held_s": w.held_s,
                "left_s": w.left_s,
            }
            for w in p.waiting
        ],  # fmt: skip
    }


# What `explain` shows of each fact, in this order (a field a fact lacks is left out).
EXPLAIN_FIELDS: dict[str, tuple[str, ...]] = {
    "instance": ("status", "stage", "daemon", "sidecar", "tasks_running", "idle_for_s",
                 "stage_age_s", "restarts_1h", "drained", "parked", "host_rate", "dph"),
    "demand": ("task", "pending", "running", "oldest_pending_s", "forecast_pending",
               "forecast_instances", "task_s", "backlog_slots"),
    "fleet": ("instances", "active", "serving", "booting", "drained", "parked", "pending",
              "running_tasks", "spend_per_h"),
    "sensor": ("state", "detail"),
}  # fmt: skip


def _as_in_rules(value: Any) -> str:
    """A fact's value as a rules file writes it: true/false, "" for empty text, numbers to
    three decimals."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{round(value, 3):g}"
    return '""' if value == "" else str(value)


def explain(app: App, as_json: bool) -> int:
    planned = app.controller.plan(app.controller.clock())
    doc = explain_doc(planned)
    if as_json:
        print(json.dumps(doc, indent=2, sort_keys=True, default=str))
        return 0
    print(
        f"now {_ts(planned.now)}: {len(planned.facts)} facts, "
        f"rules {app.controller.rules.book.digest}"
    )
    print("\nfacts (the fields rules use most; --json has every field):")
    for f in planned.facts:
        keys = EXPLAIN_FIELDS.get(str(f["kind"]), ())
        fields = " ".join(f"{k}={_as_in_rules(f[k])}" for k in keys if k in f)
        show(f"  {f['kind']:<8} {f['id']:<18} {fields}")
    print("\nmatching rules:")
    rules = [m for m in planned.matches if m.rule]
    for m in rules:
        print(f"  {m.rule:<34} ← {', '.join(m.facts.values())}")
    if not rules:
        print("  (none)")
    if planned.waiting:
        print("\nwaiting (for:):")
    for w in planned.waiting:
        print(
            f"  {w.rule:<34} ← {w.subject}: held {show_duration(w.held_s)} of "
            f"{show_duration(w.for_s)}, fires in {show_duration(w.left_s)}"
        )
    print("\nplan:")
    for d in doc["plan"]:
        show(
            f"  {d['verdict']:<10} {d['action']} {brief(d['params'])} ← {d['proposer']}: {d['why']}"
        )
    if not doc["plan"]:
        print("  (nothing to do)")
    print("\nwould escalate:")
    for e in doc["escalations"]:
        show(f"  {e['kind']:<16} {e['subject']}: {e['summary']}")
    if not doc["escalations"]:
        print("  (nothing)")
    return 0


def print_actions(rows: list[dict[str, Any]]) -> None:
    for r in rows:
        show(
            f"#{r['id']:<5} {_ts(r['at'])} {r['verdict']:<10} {r['status']:<8} {r['action']:<14} "
            f"{brief(r['params']):<28} ← {r['proposer']}: {r['why']}"
        )
    if not rows:
        print("(no actions)")


def print_escalations(rows: list[dict[str, Any]]) -> None:
    for e in rows:
        show(
            f"#{e['id']:<4} {_ts(e['created_at'])} {e['status']:<9} {e['kind']:<16} "
            f"{e['subject']}: {e['summary']}"
        )
    if not rows:
        print("(no escalations)")


def escalations(app: App, args: argparse.Namespace, by: str) -> int:
    """approve | deny (list and show read the journal alone: controller/service/offline.py)."""
    j, sub = app.journal, args.esc_command
    now = app.controller.clock()
    if args.fingerprint is not None:
        approvals.same_escalation(j, args.id, args.fingerprint)
    if sub == "deny":
        approvals.deny(j, args.id, by=by, now=now)
        app.controller.escalator.closed(args.id)
        print(f"escalation #{args.id} denied by {by}")
        return 0
    params = _params(args.param) if args.param else None
    answer = approvals.approve(
        j, args.id, by=by, now=now, action=args.action, params=params, override=args.override
    )
    app.controller.escalator.closed(args.id)
    print(
        f"escalation #{args.id} approved by {by}: {answer['action']} {brief(answer['params'])} "
        "runs through the guards on the next tick"
    )
    return 0


def _params(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep:
            raise approvals.ApprovalError(f"--param {pair!r}: expected KEY=VALUE")
        out[key] = _scalar(raw)
    return out


def _scalar(raw: str) -> Any:
    """The text, unquoted when it is a quoted YAML scalar (`"10004"`), None for `null`; the
    action's descriptor converts it to its field's type (`count=3` an int, `block_host=true` a
    bool, `instance=10004` the string "10004") or says why it cannot."""
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw
    if value is None and raw.strip() in ("null", "~"):
        return None
    return value if isinstance(value, str) else raw


def print_status(st: dict[str, Any]) -> None:
    for line in status_lines(st):
        show(line)


def show(line: str) -> None:
    """Print one line of a text view. Its values come from the journal, and some from voices
    fleetgate does not trust (vast labels, Curio rows, agents, the LLM): control characters
    are shown escaped, so none moves the cursor, sets the terminal's title or starts a line
    that looks like another."""
    print(escape_controls(line))


def tick_once(app: App) -> int:
    """`fleetgate tick` (cron): one tick, only if no other controller leads; then let go, and
    give the escalation outbox at most `escalation.outbox_step_s` (the rest waits for the
    next run)."""
    from controller.store.lease import read

    claim = lease(app.config, app.journal)
    if not claim.renew():
        st = read(app.journal, claim.name)
        print(f"fleetgate: {st.holder} leads (token {st.token}, {st.expires_in_s:.0f} s left): "
              "not ticking; if that is a `fleetgate run` on this journal, it ticks by itself: "
              "drop this cron line (or stop the service); if it is an earlier `fleetgate tick` "
              "still running, ticks take longer than the cron interval",
              file=sys.stderr)  # fmt: skip
        return 0
    # renewed while the tick runs, as `run`'s lease thread does: a tick longer than the TTL
    # (a slow listing, vast's backoff) had every action after it refused as a stale leader's
    done = threading.Event()

    def keep() -> None:
        while not done.wait(app.config.lease.renew_s) and claim.leading:
            try:
                claim.renew()
            except JournalError as exc:  # the tick's own writes meet the same trouble
                log.error("lease %r: %s", claim.name, exc)

    keeper = threading.Thread(target=keep, name="lease", daemon=True)
    keeper.start()
    try:
        app.controller.tick()
    finally:
        done.set()
        keeper.join()
        claim.release()
    app.outbox_step()
    return 0


def llm_check(app: App, threshold: float | None) -> int:
    """Probe the configured LLM with fixed situations; remember the result for require_check."""
    from escalation.llm_check import check_passes, format_report, run_check

    section = app.config.escalation.llm
    if section is None:
        print("no LLM is configured (escalation.llm in the config)", file=sys.stderr)
        return 2
    limit = section.check_threshold if threshold is None else threshold
    renderer = Renderer(app.config.escalation.templates_dir)
    from escalation.llm import MemoryUsage

    client = llm_reader.llm_client(section, app.journal, renderer, clock=time.time,
                                   sleep=time.sleep, usage=MemoryUsage())  # fmt: skip
    report = run_check(client)  # the probes spend no service budget
    print(format_report(report))
    ok = check_passes(report, limit)
    llm_reader.record_check(app.journal, section, report.ratio, app.controller.clock())
    print(f"{'PASS' if ok else 'FAIL'}: {report.ratio:.0%} of probes passed (need {limit:.0%})")
    return 0 if ok else 1
