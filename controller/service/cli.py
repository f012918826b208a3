"""The `fleetgate` command.

fleetgate [--config FILE] [--state DIR] COMMAND
  run [--ticks N] [--seed S]   ticks on the configured interval until stopped (or N ticks)
  tick                         exactly one tick (for cron); continues from the journal
  check [PATHS...]             validate rules and config; `path:line: message` on errors
  explain [--json]             sense once, show facts → rules → plan → escalations; no changes
  test-rules [PATHS...]        run rule unit tests (rules/tests/*.yaml)
  actions [--json] [--all]     what the controller did (and, with --all, decided not to do)
  escalations list|show|approve|deny
  status [--json]
  llm-check [--threshold R]    probe the configured LLM; exit 1 below the threshold
  bench sim [--ticks N] [--seed S]   time whole ticks on the simulator
  bench tick [--instances N,N] [--repeat N] [--path real|synthetic]   one tick's phases at N
  bench soak [--ticks N] [--instances N]   memory over many ticks (RSS at start and end)
  simulate --trace FILE [--days N] [--report DIR]   replay a trace: fleetgate vs baselines
  pause | resume
"""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import sys
import time
from typing import Any

from controller.core import actions as vocabulary
from controller.rules.rulebook import RulesError
from controller.rules.source import read_rulebook
from controller.service import gc_tuning
from controller.service.app import App, status
from controller.service.assemble import assemble, lease
from controller.service.config import ConfigError, load_config, rules_paths, state_dir
from controller.service.schedule import Runner
from controller.service.secrets import Redactor
from controller.tools.replay import command as simulate_command
from escalation import approvals

log = logging.getLogger("fleetgate")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fleetgate",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", metavar="FILE", help="config file (default: built-in simulator)")
    p.add_argument("--state", metavar="DIR", help="state directory (default: ./.fleetgate)")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.add_argument("--log-format", default="text", choices=["text", "json"])
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
    sub.add_parser("pause", help="stop acting (decisions are still made and recorded)")
    sub.add_parser("resume", help="act again")
    return p


def _add_loop_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """run, tick, check, explain, test-rules and actions: the loop, its rules and its journal."""
    run = sub.add_parser("run", help="tick on the configured interval until stopped")
    run.add_argument("--ticks", type=int, help="stop after N ticks")
    run.add_argument("--seed", type=int, help="simulator seed for a new state directory")
    sub.add_parser("tick", help="run exactly one tick and exit")
    check = sub.add_parser("check", help="validate rules files and the config")
    check.add_argument("paths", nargs="*")
    explain = sub.add_parser("explain", help="show what a tick would do; changes nothing")
    explain.add_argument("--json", action="store_true")
    tr = sub.add_parser("test-rules", help="run rule unit tests")
    tr.add_argument("paths", nargs="*")
    acts = sub.add_parser("actions", help="the journal of actions")
    acts.add_argument("--json", action="store_true")
    acts.add_argument("--all", action="store_true", help="also vetoed, asked, superseded ones")
    acts.add_argument("--limit", type=int, default=100)


_ESCALATION_STATUSES = ["pending", "approved", "denied", "expired", "executed", "resolved",
                        "void", "vetoed", "failed"]  # fmt: skip


def _add_escalations(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """escalations list | show | approve | deny."""
    esc = sub.add_parser("escalations", help="list, show, approve or deny escalations")
    esc_sub = esc.add_subparsers(dest="esc_command", required=True, metavar="SUBCOMMAND")
    lst = esc_sub.add_parser("list")
    lst.add_argument("--json", action="store_true")
    lst.add_argument("--status", choices=_ESCALATION_STATUSES)
    show = esc_sub.add_parser("show")
    show.add_argument("id", type=int)
    show.add_argument("--json", action="store_true")
    for name in ("approve", "deny"):
        a = esc_sub.add_parser(name)
        a.add_argument("id", type=int)
        a.add_argument("--by", default=None, help="who answers (default: your user name)")
        if name == "approve":
            _add_approve_options(a)


def _add_approve_options(a: argparse.ArgumentParser) -> None:
    a.add_argument("--action", choices=list(vocabulary.ACTIONS))
    a.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="action parameter (repeatable); values are JSON or text",
    )
    a.add_argument("--override", action="append", default=[], metavar="CAP",
                   help="a budget cap this answer may exceed (repeatable; journaled): "
                   "max_instances, max_launches_per_tick, max_launches_per_hour, "
                   "max_spend_per_hour")  # fmt: skip


def _add_bench(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """bench sim | soak | tick."""
    bench = sub.add_parser("bench", help="measure the controller (prints numbers)")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True, metavar="WHAT")
    bsim = bench_sub.add_parser("sim", help="whole ticks on the simulator")
    bsim.add_argument("--ticks", type=int, default=400)
    bsim.add_argument("--seed", type=int, default=7)
    bsim.add_argument("--json", action="store_true")
    bsoak = bench_sub.add_parser("soak", help="many ticks at one size: RSS at start and end")
    bsoak.add_argument("--ticks", type=int, default=100_000)
    bsoak.add_argument("--instances", type=int, default=1000)
    bsoak.add_argument("--churn", type=int, default=10, help="instances replaced per tick")
    bsoak.add_argument("--sample-every", type=int, default=10_000, help="ticks between samples")
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


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(
            {
                "ts": record.created,
                "level": record.levelname,
                "logger": record.name,
                "msg": record.getMessage(),
            }
        )


def _logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        _JsonFormatter()
        if fmt == "json"
        else logging.Formatter("%(asctime)s %(levelname)-7s %(message)s", "%H:%M:%S")
    )
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
        return _dispatch(args)
    except (ConfigError, RulesError) as exc:  # `check` reports them; other commands refuse to start
        print(exc, file=sys.stderr)
        return 1 if args.command == "check" else 2
    except approvals.ApprovalError as exc:
        print(f"fleetgate: {exc}", file=sys.stderr)
        return 2


def _dispatch(args: argparse.Namespace) -> int:
    from controller.service import commands  # the command bodies

    if args.command == "simulate":
        return simulate_command.simulate(args)
    config = load_config(args.config)
    state = state_dir(config, args.state)
    if args.command == "check":
        return commands.check(args, config)
    if args.command == "bench" and args.bench_command == "soak":
        from controller.tools.bench.soak import render as render_soak
        from controller.tools.bench.soak import soak

        if min(args.ticks, args.instances, args.sample_every) < 1 or args.churn < 0:
            print("fleetgate: --ticks, --instances, --sample-every must be >= 1", file=sys.stderr)
            return 2
        doc = soak(config, ticks=args.ticks, instances=args.instances, churn=args.churn,
                   sample_every=args.sample_every, progress=sys.stderr)  # fmt: skip
        _emit(doc) if args.json else print(render_soak(doc))
        return 0
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

        result = bench_sim(config, args.ticks, args.seed)
        _emit(result) if args.json else print(render(result))
        return 0
    if args.command == "test-rules":
        return commands.test_rules(args.paths or [str(p / "tests") for p in rules_paths(config)])
    # explain reads and writes nothing: on an existing SQLite journal, opened read-only
    read_only = args.command == "explain" and config.journal is None
    read_only = read_only and (state / "journal.db").exists()
    app = assemble(config, state=state, clock=time.time, sleep=time.sleep,
                   config_path=args.config, seed=getattr(args, "seed", None),
                   read_only=read_only)  # fmt: skip
    try:
        return _with_app(app, args)
    finally:
        app.close()


def _with_app(app: App, args: argparse.Namespace) -> int:
    from controller.service import commands

    cmd = args.command
    if cmd == "run":
        api = app.serve_api()
        runner = Runner(app.controller.tick, app.config.interval_s, args.ticks,
                        on_hup=app.controller.rules.force,
                        lease=lease(app.config, app.journal),
                        renew_s=app.config.lease.renew_s,
                        outbox=app.outbox_thread())  # fmt: skip
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
    if cmd == "actions":
        rows = app.journal.actions.recent(args.limit, executed_only=not args.all)
        if args.json:
            _emit(rows)
        else:
            commands.print_actions(rows)
        return 0
    if cmd == "escalations":
        return commands.escalations(app, args, by=args.__dict__.get("by") or _user())
    if cmd == "status":
        st = status(app)
        _emit(st) if args.json else commands.print_status(st)
        return 0
    if cmd in ("pause", "resume"):
        app.journal.meta.put("paused", cmd == "pause")
        print(
            "paused: decisions are recorded, nothing is acted on"
            if cmd == "pause"
            else "resumed: acting again"
        )
        return 0
    raise AssertionError(cmd)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "operator"


__all__ = ["main", "read_rulebook"]
