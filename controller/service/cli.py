"""The `fleetgate` command.

fleetgate [--config FILE] [--state DIR] [--log-level L] [--log-format F] COMMAND
  (the four options also after the command: `fleetgate status --state DIR`)
  init DIR [--force]           a starter config and the shipped rules to edit, in DIR
  run [--ticks N] [--seed S]   ticks on the configured interval until stopped (or N ticks)
  tick                         exactly one tick (for cron); continues from the journal
  check [PATHS...]             validate rules and config; `path:line: message` on errors
  explain [--json]             sense once, show facts → rules → plan → escalations; no changes
  test-rules [PATHS...]        run rule unit tests (rules/tests/*.yaml)
  actions [--json] [--all]     what the controller did (and, with --all, decided not to do)
  escalations list|show|approve|deny
  status [--json]
  prune [--days N] [--dry-run]   delete journal rows older than the retention
  llm-check [--threshold R]    probe the configured LLM; exit 1 below the threshold
  bench sim [--ticks N] [--seed S]   time whole ticks on the simulator
  bench tick [--instances N,N] [--repeat N] [--path real|synthetic]   one tick's phases at N
  bench soak [--ticks N] [--instances N] [--path real|synthetic]   memory over many ticks
  simulate --trace FILE | --shape short [--days N] [--report DIR]   fleetgate vs baselines
  suggest-rules [--min-answers N] [--out DIR]   candidate rules from people's answers
  pause | resume

status, actions, escalations list|show, pause and resume read the journal alone: they work
while the rules are broken or a secret is unset (and say so on stderr), and never create a
journal (`no journal at PATH`, exit 1). escalations approve|deny create none either, and take
an unset secret as a warning (the running controller acts on the answer).
"""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import math
import os
import shutil
import sys
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from controller.core import actions as vocabulary
from controller.rules.rulebook import RulesError
from controller.rules.source import read_rulebook
from controller.service import gc_tuning, offline, suggest_cmd
from controller.service.app import App
from controller.service.assemble import assemble, lease, open_journal
from controller.service.config import (
    Config,
    ConfigError,
    load_config,
    rules_paths,
    state_dir,
    unreachable_links,
)
from controller.service.hup import ConfigReload
from controller.service.initdir import program
from controller.service.schedule import Runner
from controller.service.secrets import Redactor
from controller.store import retention
from controller.store.backend import JournalError
from controller.store.retention import Pruner
from controller.tools.replay import command as simulate_command
from escalation import approvals
from escalation.situation import escape_controls

log = logging.getLogger("fleetgate")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fleetgate",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"fleetgate {_version()}")
    _add_common(p, None)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_loop_commands(sub)
    _add_escalations(sub)
    st = sub.add_parser("status", help="fleet, queue, last tick, pending escalations")
    st.add_argument("--json", action="store_true")
    _add_bench(sub)
    check_llm = sub.add_parser("llm-check", help="probe the configured LLM's tool calling")
    check_llm.add_argument(
        "--threshold",
        type=float,
        help="share of probes that must pass (default: escalation.llm.check_threshold)",
    )
    simulate_command.add_parser(sub)
    suggest_cmd.add_parser(sub)
    sub.add_parser("pause", help="stop acting (decisions are still made and recorded)")
    sub.add_parser("resume", help="act again")
    prune = sub.add_parser("prune", help="delete journal rows older than retention.days")
    prune.add_argument("--days", type=_days, help="keep this many days (default: the config's)")
    prune.add_argument("--dry-run", action="store_true", help="count, delete nothing")
    init = sub.add_parser("init", help="write a starter config and the shipped rules into DIR")
    init.add_argument("dir", metavar="DIR")
    init.add_argument("--force", action="store_true", help="overwrite files already there")
    _share_common(p)
    return p


_COMMON = ("--config", "--state", "--log-level", "--log-format")


def _add_common(p: argparse.ArgumentParser, default: Any) -> None:
    """The options every command takes; `default` None at the top, SUPPRESS after a command
    (so that a value given before the command stands unless given again after it)."""
    top = default is None
    options: dict[str, dict[str, Any]] = {
        "--config": {"metavar": "FILE", "help": "config file (default: built-in simulator)"},
        "--state": {"metavar": "DIR", "help": "state directory (default: the config's "
                                              "state_dir, else $FLEETGATE_STATE, else "
                                              "./.fleetgate)"},
        "--log-level": {"default": "INFO", "choices": ["DEBUG", "INFO", "WARNING", "ERROR"]},
        "--log-format": {"default": "text", "choices": ["text", "json"],
                         "help": "json: one object a line (ts, level, logger, msg, extras)"},
    }  # fmt: skip
    for flag, kw in options.items():
        if flag in p._option_string_actions:  # `simulate --config` is its own
            continue
        if not top:
            kw = {**kw, "default": argparse.SUPPRESS}
        p.add_argument(flag, **kw)


def _share_common(p: argparse.ArgumentParser) -> None:
    """Add the common options to every (sub)command's parser."""
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, child in action.choices.items():
                if child.description is None and helps.get(name):
                    child.description = helps[name]  # `fleetgate run --help` says what it does
            for child in dict.fromkeys(action.choices.values()):
                _add_common(child, argparse.SUPPRESS)
                _share_common(child)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fleetgate")
    except PackageNotFoundError:
        return "(not installed)"


MAX_INT = 2**63 - 1  # the journal's integers (SQLite and PostgreSQL BIGINT)


def _days(text: str) -> float:
    """An argparse type: a number of days, at least 1 (`nan` or `inf` kept everything)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text[:40]!r}") from None
    if not (math.isfinite(value) and value >= 1):
        raise argparse.ArgumentTypeError(f"{text[:40]} is not a number of days, at least 1")
    return value


_days.__name__ = "days"


def _whole(low: int) -> Callable[[str], int]:
    """An argparse type: a whole number from `low` to MAX_INT (a journal id, a count)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text[:40]!r}") from None
        if not low <= value <= MAX_INT:
            raise argparse.ArgumentTypeError(f"{text[:40]} is not between {low} and {MAX_INT}")
        return value

    parse.__name__ = "number"  # argparse names the type in its message
    return parse


def _add_loop_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """run, tick, check, explain, test-rules and actions: the loop, its rules and its journal."""
    run = sub.add_parser("run", help="tick on the configured interval until stopped")
    run.add_argument("--ticks", type=_whole(0), help="stop after N ticks")
    run.add_argument("--seed", type=int, help="simulator seed for a new state directory")
    sub.add_parser("tick", help="run exactly one tick and exit")
    check = sub.add_parser("check", help="validate rules files and the config")
    check.add_argument("paths", nargs="*", help="rules files or folders (default: the config's)")
    check.add_argument("--connect", action="store_true",
                       help="also read vast's listing and Curio's queue once (writes nothing): "
                            "a wrong key or DSN shows here, not at the first tick")  # fmt: skip
    explain = sub.add_parser("explain", help="show what a tick would do; changes nothing")
    explain.add_argument("--json", action="store_true")
    tr = sub.add_parser("test-rules", help="run rule unit tests")
    tr.add_argument(
        "paths", nargs="*", help="rule test files or folders (default: tests/ in each rules folder)"
    )
    acts = sub.add_parser("actions", help="the journal of actions")
    acts.add_argument("--json", action="store_true")
    acts.add_argument("--all", action="store_true", help="also vetoed, asked, superseded ones")
    acts.add_argument("--limit", type=_whole(1), default=100)


_ESCALATION_STATUSES = ["pending", "approved", "denied", "expired", "executed", "resolved",
                        "void", "vetoed", "failed", "interrupted"]  # fmt: skip


def _add_escalations(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """escalations list | show | approve | deny."""
    esc = sub.add_parser("escalations", help="list, show, approve or deny escalations",
                         description="What waits on people, and their answers.")  # fmt: skip
    esc_sub = esc.add_subparsers(dest="esc_command", required=True, metavar="SUBCOMMAND",
                                 title="subcommands")  # fmt: skip
    lst = esc_sub.add_parser("list", help="escalations, newest first")
    lst.add_argument("--json", action="store_true")
    lst.add_argument("--status", choices=_ESCALATION_STATUSES)
    show = esc_sub.add_parser("show", help="one escalation and its trail (--json: every field)")
    show.add_argument("id", type=_whole(1))
    show.add_argument("--json", action="store_true")
    for name, what in (("approve", "approve one (optionally another action or parameters)"),
                       ("deny", "deny one: nothing is done")):  # fmt: skip
        a = esc_sub.add_parser(name, help=what)
        a.add_argument("id", type=_whole(1))
        a.add_argument("--by", default=None, help="who answers (default: your user name)")
        a.add_argument("--fingerprint", default=None, metavar="FP",
                       help="answer only the escalation with this fingerprint (messages print "
                       "it where the id alone could name another one)")  # fmt: skip
        if name == "approve":
            _add_approve_options(a)


def _add_approve_options(a: argparse.ArgumentParser) -> None:
    a.add_argument("--action", choices=list(vocabulary.ACTIONS))
    a.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="action parameter (repeatable); a YAML scalar (10, true, 1.5) or text, "
        "checked against the action's parameters",
    )
    a.add_argument("--override", action="append", default=[], metavar="CAP",
                   help="a budget cap this answer may exceed (repeatable; journaled): "
                   "max_instances, max_launches_per_tick, max_launches_per_hour, "
                   "max_spend_per_hour")  # fmt: skip


SOAK_DEFAULTS = (
    ("--ticks", "default: 16 days of virtual time (real), 100000 (synthetic)"),
    ("--instances", "the fleet's cap (real, default 200), its size (synthetic, default 1000)"),
    ("--churn", "synthetic: instances replaced per tick (default 10)"),
    ("--sample-every", "ticks between samples (default: a tenth of the ticks)"),
)


def _add_bench(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """bench sim | soak | tick."""
    bench = sub.add_parser("bench", help="measure the controller (prints numbers)")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True, metavar="WHAT")
    bsim = bench_sub.add_parser("sim", help="whole ticks on the simulator")
    bsim.add_argument("--ticks", type=int, default=400)
    bsim.add_argument("--seed", type=int, default=7)
    bsim.add_argument("--json", action="store_true")
    bsoak = bench_sub.add_parser("soak", help="many ticks at one size: RSS at start and end")
    bsoak.add_argument("--path", choices=("real", "synthetic"), default="real",
                       help="real: `fleetgate run` on the simulator, a world sized for "
                       "--instances (default); synthetic: a fixed fleet that accepts every "
                       "action")  # fmt: skip
    for flag, why in SOAK_DEFAULTS:  # integers whose default depends on --path
        bsoak.add_argument(flag, type=int, default=None, help=why)
    bsoak.add_argument("--seed", type=int, default=7, help="real: the simulated world's seed")
    bsoak.add_argument("--json", action="store_true")
    _add_bench_tick(bench_sub.add_parser("tick", help="one tick's phases on fleets of N instances"))


def _add_bench_tick(btick: argparse.ArgumentParser) -> None:
    btick.add_argument(
        "--instances",
        default="10,100,1000,10000",
        metavar="N,N,...",
        help="fleet sizes (default: 10,100,1000,10000)",
    )
    btick.add_argument(
        "--repeat",
        type=int,
        default=5,
        help="measured ticks per size (at most 3 from 10,000 instances)",
    )
    btick.add_argument(
        "--path",
        choices=["real", "synthetic"],
        default="real",
        help="real: the production fleet path (vast client, Curio sensor, probes, agent "
        "records) on a simulated world; synthetic: a listing that costs nothing (default: real)",
    )
    btick.add_argument("--json", action="store_true")


_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ts (ISO 8601, UTC), level, logger, msg, the `extra=` fields
    of the call, and `exc` (the traceback) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                doc[key] = value
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:  # as the Redactor left it
            doc["exc"] = record.exc_text
        return json.dumps(doc, default=str)


class _Shown:
    """A log call's argument as text that moves no cursor and starts no line (see EscapedArgs);
    its repr as repr gives it."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __str__(self) -> str:
        return escape_controls(str(self.value))

    def __repr__(self) -> str:
        return escape_controls(repr(self.value))


class EscapedArgs(logging.Filter):
    """The text log shows each argument of a log call with its control characters escaped:
    an argument may be what an instance, a Curio row, vast or the LLM wrote, and a newline in
    it would start a log line (a journald entry) of its own, an escape sequence would reach
    the terminal. The message's own text (the code's format string) keeps its newlines.
    Numbers pass as they are, for `%d` and `%.2f`."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, Mapping):
            record.args = {k: _escaped(v) for k, v in args.items()}
        elif args:
            record.args = tuple(_escaped(a) for a in args)
        elif not isinstance(record.msg, str):
            record.msg = _Shown(record.msg)
        return True


def _escaped(value: Any) -> Any:
    return value if value is None or isinstance(value, int | float) else _Shown(value)


def _logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter()
        if fmt == "json"
        else logging.Formatter("%(asctime)s %(levelname)-7s %(message)s", "%H:%M:%S")
    )
    if fmt != "json":  # JSON escapes them itself
        handler.addFilter(EscapedArgs())
    handler.addFilter(Redactor())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    logging.getLogger("urllib3").setLevel(logging.WARNING)  # it logs request URLs (secrets)


def _emit(obj: Any) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True, default=str))


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _logging(args.log_level, args.log_format)
    gc_tuning.tune()
    try:
        code = _dispatch(args)
        sys.stdout.flush()  # a closed pipe shows here, not at exit
        return code
    except BrokenPipeError:  # `fleetgate actions | head`: the reader has what it wanted
        _quiet_stdout()
        return 141  # as a shell reports a process killed by SIGPIPE
    except (ConfigError, RulesError) as exc:  # `check` reports them; other commands refuse to start
        print(exc, file=sys.stderr)
        return 1 if args.command == "check" else 2
    except (approvals.ApprovalError, StateError, JournalError) as exc:
        print(f"fleetgate: {exc}", file=sys.stderr)
        return 2
    except offline.NoJournal as exc:
        print(f"fleetgate: {exc}", file=sys.stderr)
        return 1


class StateError(Exception):
    """The state directory cannot be created or written."""


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's flush at exit finds no pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _writable_state(config: Config, state: Path) -> None:
    """A `StateError` if a SQLite journal's state directory cannot be created or written
    (checked without creating it: a config that is refused must leave nothing behind)."""
    if config.journal is not None:
        return
    probe = state.absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    problem = None
    if not probe.is_dir():
        problem = "Not a directory"
    elif not os.access(probe, os.W_OK | os.X_OK):
        problem = "Permission denied"
        if os.statvfs(probe).f_flag & os.ST_RDONLY:  # chmod would not help: say where it is
            problem = ("Read-only file system (under systemd's ProtectSystem=strict only "
                       "ReadWritePaths= and StateDirectory= are writable)")  # fmt: skip
    if problem:
        raise StateError(f"state directory {str(state)!r} is not writable: {problem}")


def _soak(args: argparse.Namespace, config: Config) -> int:
    from controller.tools.bench import soak

    real = args.path == "real"
    instances = args.instances if args.instances is not None else 200 if real else 1000
    ticks = args.ticks if args.ticks is not None or real else 100_000
    every = args.sample_every
    if every is None and ticks is not None:
        every = max(ticks // 10, 1)
    given = [n for n in (ticks, instances, every) if n is not None]  # 0 is given, not None
    if min(given) < 1 or (args.churn or 0) < 0:
        print("fleetgate: --ticks, --instances, --sample-every must be >= 1, --churn >= 0",
              file=sys.stderr)  # fmt: skip
        return 2
    if real and args.churn is not None:
        print("fleetgate: --churn is for --path synthetic; on the real path the simulated "
              "world brings and takes instances", file=sys.stderr)  # fmt: skip
        return 2
    if real:
        doc = soak.soak_real(config, ticks=ticks, instances=instances, sample_every=every,
                             seed=args.seed, progress=sys.stderr)  # fmt: skip
    else:
        assert ticks is not None and every is not None
        doc = soak.soak_synthetic(config, ticks=ticks, instances=instances,
                                  churn=10 if args.churn is None else args.churn,
                                  sample_every=every, progress=sys.stderr)  # fmt: skip
    _emit(doc) if args.json else print(soak.render(doc))
    return 0


def _dispatch(args: argparse.Namespace) -> int:
    from controller.service import commands  # the command bodies

    if args.command == "simulate":
        return simulate_command.simulate(args)
    if args.command == "suggest-rules":
        return suggest_cmd.run(args)
    if args.command == "init":
        return _init(args)
    if offline.wants_offline(args.command, getattr(args, "esc_command", None)):
        return _offline(args)
    if args.command == "escalations":  # approve | deny
        config = offline.answering_config(args.config, args.state)
    else:
        config = load_config(args.config)
    state = state_dir(config, args.state)
    if args.command == "check":
        return commands.check(args, config)
    if args.command == "bench" and args.bench_command == "soak":
        return _soak(args, config)
    if args.command == "bench" and args.bench_command == "tick":
        from controller.tools.bench.tick import bench_tick, parse_sizes, render_tick

        try:
            sizes = parse_sizes(args.instances)
        except ValueError as exc:
            print(f"fleetgate: {exc}", file=sys.stderr)
            return 2
        doc = bench_tick(config, sizes, max(args.repeat, 1), path=args.path)
        _emit(doc) if args.json else print(render_tick(doc))
        return 0
    if args.command == "bench":
        from controller.tools.bench.sim import bench_sim, render

        if args.ticks < 1:
            print(f"fleetgate: --ticks must be >= 1, got {args.ticks}", file=sys.stderr)
            return 2
        result = bench_sim(config, args.ticks, args.seed)
        _emit(result) if args.json else print(render(result))
        return 0
    if args.command == "test-rules":
        return commands.test_rules(args.paths or [str(p / "tests") for p in rules_paths(config)])
    if args.command == "prune":
        return _prune(args, config, state)
    # explain reads and writes nothing: an existing SQLite journal opened read-only, else none
    # at all (an empty one in memory: what a first tick would do)
    explain = args.command == "explain"
    read_only = explain and config.journal is None and (state / "journal.db").exists()
    dry = explain and config.journal is None and not read_only
    if not explain:
        _writable_state(config, state)
    app = assemble(config, state=state, clock=time.time, sleep=time.sleep,
                   config_path=args.config, seed=getattr(args, "seed", None),
                   read_only=read_only, dry=dry,
                   person=args.command in ("escalations", "explain"),
                   program=program(sys.argv[0], shutil.which("fleetgate")))  # fmt: skip
    try:
        return _with_app(app, args)
    finally:
        app.close()


def _with_app(app: App, args: argparse.Namespace) -> int:
    from controller.service import commands

    cmd = args.command
    if cmd == "run":
        from controller.service.api import ApiStartError

        try:
            api = app.serve_api()
        except ApiStartError as exc:  # the port taken (another `run`?): a sentence, no trace
            print(f"fleetgate: {exc}", file=sys.stderr)
            return 2
        hup = ConfigReload(app, args.config)
        pruner = Pruner(app.journal.store, app.config.retention)

        def tick() -> None:
            hup.apply()
            app.controller.tick()
            pruner.settings = app.config.retention  # a SIGHUP may have changed it
            pruner.after_tick(app.controller.clock())

        runner = Runner(tick, app.config.interval_s, args.ticks, on_hup=hup.request,
                        lease=lease(app.config, app.journal),
                        renew_s=app.config.lease.renew_s,
                        outbox=app.outbox_thread(), notify=app.notifier())  # fmt: skip
        if links := unreachable_links(app.config):
            log.warning("%s", links)
        log.info(
            "fleetgate running: %s, rules %s, every %.2fs%s",
            app.config.provider,
            app.controller.rules.book.digest,
            app.config.interval_s,
            f", {args.ticks} ticks" if args.ticks else "",
        )
        try:
            done = runner.run()
        finally:
            if api is not None:
                api.stop()
        log.info("stopped after %d tick(s) (%d failed)", done, runner.failed)
        return 0
    if cmd == "llm-check":
        return commands.llm_check(app, args.threshold)
    if cmd == "tick":
        return commands.tick_once(app)
    if cmd == "explain":
        return commands.explain(app, args.json)
    if cmd == "escalations":
        return commands.escalations(app, args, by=args.__dict__.get("by") or _user())
    raise AssertionError(cmd)


def _offline(args: argparse.Namespace) -> int:
    """status, actions, escalations list|show, pause, resume: the journal alone
    (controller/service/offline.py)."""
    from controller.service import commands

    cmd = args.command
    with offline.opened(args.config, args.state, write=cmd in ("pause", "resume")) as off:
        j = off.journal
        if cmd == "status":
            st = offline.status_doc(off)
            _emit(st) if args.json else commands.print_status(st)
        elif cmd == "actions":
            rows = j.actions.recent(args.limit, executed_only=not args.all)
            _emit(rows) if args.json else commands.print_actions(rows)
        elif cmd == "escalations" and args.esc_command == "list":
            rows = j.escalations.recent(status=args.status)
            _emit(rows) if args.json else commands.print_escalations(rows)
        elif cmd == "escalations":
            esc = offline.escalation_doc(j, args.id)
            if esc is None:
                raise approvals.ApprovalError(f"no escalation #{args.id}")
            if args.json:
                _emit(esc)
            else:
                for line in offline.render_escalation(esc, commands.ts):
                    commands.show(line)
        else:
            j.meta.put("paused", cmd == "pause")
            print("paused: decisions are recorded, nothing is acted on" if cmd == "pause"
                  else "resumed: acting again")  # fmt: skip
    return 0


def _prune(args: argparse.Namespace, config: Config, state: Path) -> int:
    """`fleetgate prune`: the retention pass now, to the end (controller/store/retention.py),
    measured from the last tick's time (the controller's clock, virtual on the simulator)."""
    days = args.days if args.days is not None else config.retention.days
    if days is None or days < 1:
        print("fleetgate: prune needs --days N (at least 1) or retention.days in the config",
              file=sys.stderr)  # fmt: skip
        return 2
    if config.journal is None and not (state / "journal.db").is_file():
        raise offline.NoJournal(f"no journal at {state / 'journal.db'} (see --state, --config)")
    journal = open_journal(config, state, person=True)
    try:
        now = journal.meta.last_now()
        if now is None:
            print("nothing to prune: no tick yet")
            return 0
        if args.dry_run:
            found = retention.count(journal.store, now, days)
        else:
            found, _ = retention.prune(journal.store, now, days, batch=config.retention.batch)
    finally:
        journal.close()
    verb = "would delete" if args.dry_run else "deleted"
    rows = ", ".join(f"{n} {t}" for t, n in found.items()) or "nothing"
    print(f"{verb} {rows} (older than {days:g} days before the last tick)")
    return 0


def _init(args: argparse.Namespace) -> int:
    """`fleetgate init DIR` (controller/service/initdir.py); 1 when it would overwrite."""
    from controller.service.initdir import InitError, init

    try:
        written = init(Path(args.dir), force=args.force)
    except InitError as exc:
        print(f"fleetgate init: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {written.config} and {len(written.rules)} rules file(s) with "
          f"{len(written.tests)} test file(s) in {written.config.parent / 'rules'}")  # fmt: skip
    print("next:")
    run = program(sys.argv[0], shutil.which("fleetgate"))
    for command in written.next_commands(str(written.config), run):
        print(f"  {command}")
    return 0


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "operator"


__all__ = ["main", "read_rulebook"]
