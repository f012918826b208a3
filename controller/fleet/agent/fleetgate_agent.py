#!/usr/bin/env python3
"""fleetgate-agent: an instance's side of the fleetgate instance API (standard library only).

    fleetgate_agent.py register [--min-rate R] [--vast-id N] [--host-and-port H:P]
    fleetgate_agent.py stage params-done | bench-done --rate R | running
    fleetgate_agent.py heartbeat-loop [--interval 30] [--once]
    fleetgate_agent.py push-logs FILE [--interval 5] [--state PATH] [--once]

Settings come from the environment: FLEETGATE_URL (the controller, e.g. http://10.0.0.2:8080),
FLEETGATE_INSTANCE_TOKEN (this instance's own token, which its launch sets; or
FLEETGATE_INSTANCE_TOKEN_FILE; a shared FLEETGATE_FLEET_TOKEN only where the controller opted
in to one), FLEETGATE_LABEL (which the launch sets too; else vast's VAST_CONTAINERLABEL,
`C.<instance id>`). Every subcommand takes --supervisorctl (a command line,
default `supervisorctl`), --program (default `cuzk`) and --timeout.

Each heartbeat reports the daemon's supervisord state and uptime (`supervisorctl status`) and
runs the commands the controller queued: `restart_daemon` is `supervisorctl restart <program>`;
the result (ok, detail) is reported back, and kept until the controller has it.

The controller being down never crashes a loop: calls are retried with growing delays (1 s,
2 s, 4 s, ... up to the interval), and `register`/`stage` retry for a few minutes (--retries).
With --once, one attempt and the exit status says what happened:

    0  done          3  the controller could not be reached (or answered 429/5xx)
    2  bad settings  4  the controller refused the call (401, 403, 404, ...)    1  other error

A stage the controller already has passed (409) is not an error: a rebooted instance re-runs
its boot script. The token never appears in output.

This file is the command line; its package (`client`, `heartbeat`, `push_logs`, standard library
only) goes with it: copy the whole folder onto an image and run this file with any python3.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import Mapping, Sequence

if __name__ == "__main__" and not __package__:
    # Run as a file (`python3 fleetgate_agent.py ...`): load the folder it is in as a package,
    # whatever the folder is called, so that the imports below find the modules beside it.
    import importlib.util

    _HERE = os.path.dirname(os.path.abspath(__file__))
    _SPEC = importlib.util.spec_from_file_location(
        "fleetgate_agent_package", os.path.join(_HERE, "__init__.py"),
        submodule_search_locations=[_HERE],
    )  # fmt: skip
    assert _SPEC is not None and _SPEC.loader is not None
    sys.modules[_SPEC.name] = importlib.util.module_from_spec(_SPEC)
    _SPEC.loader.exec_module(sys.modules[_SPEC.name])
    __package__ = _SPEC.name

from .client import (  # noqa: E402
    VERSION,
    AgentError,
    Client,
    Config,
    ConfigError,
    Refused,
    Unreachable,
    load_config,
    loop,
    with_retries,
)
from .heartbeat import Heartbeats, Supervisor, parse_status  # noqa: E402
from .push_logs import Tailer, push_new_lines  # noqa: E402

__all__ = ["VERSION", "Unreachable", "main", "parse_status", "parser", "run", "with_retries"]

log = logging.getLogger("fleetgate-agent")


# Each command: (what --help lists it as, its description, its own arguments as
# (names, add_argument's keywords)). (The annotation is never evaluated: an image's older
# python3 runs this file too.)
COMMANDS: dict[str, tuple[str, str, tuple[tuple[tuple[str, ...], dict[str, object]], ...]]] = {
    "register": (
        "announce this instance once, at boot",
        "Announce this instance to the controller (at boot).",
        ((("--min-rate",), {"type": float, "metavar": "R", "help":
          "proofs/hour this instance's benchmark must reach (recorded with it)"}),
         (("--vast-id",), {"metavar": "N", "help":
          "this instance's vast id (default: from VAST_CONTAINERLABEL, C.<id>)"}),
         (("--host-and-port",), {"metavar": "H:P", "help":
          "the address this instance's Curio node announces (host:port), when not the "
          "instance's public one: believed on curio.node_networks"})),
    ),
    "stage": (
        "report a boot stage reached",
        "Report a boot stage this instance reached.",
        ((("stage",), {"choices": ("params-done", "bench-done", "running"), "help":
          "proof parameters fetched, benchmark done (with --rate), serving"}),
         (("--rate",), {"type": float, "help": "benchmark proofs/hour (bench-done)"})),
    ),
    "heartbeat-loop": (
        "report the daemon and run the controller's commands",
        "Report the daemon's state and uptime, and run the commands the controller queued "
        "(a daemon restart).",
        ((("--interval",), {"type": float, "default": 30.0, "metavar": "S",
                            "help": "seconds between heartbeats (default 30)"}),),
    ),
    "push-logs": (
        "send a log file's new lines",
        "Send the new lines of a log file to the controller.",
        ((("file",), {"help": "the log file to follow"}),
         (("--interval",), {"type": float, "default": 5.0, "metavar": "S",
                            "help": "seconds between pushes (default 5)"}),
         (("--state",), {"help": "file keeping the offset across restarts"})),
    ),
}  # fmt: skip


def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--supervisorctl", default="supervisorctl", help="command line to run")
    common.add_argument("--program", default="cuzk", help="the daemon's supervisord program")
    common.add_argument("--timeout", type=float, default=10.0, help="per HTTP call, seconds")
    common.add_argument("--retries", type=int, default=10, help="attempts for register/stage")
    common.add_argument("--once", action="store_true", help="one attempt, one pass")
    p = argparse.ArgumentParser(prog="fleetgate-agent", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name, (listed, described, arguments) in COMMANDS.items():
        command = sub.add_parser(name, parents=[common], help=listed, description=described)
        for names, keywords in arguments:
            command.add_argument(*names, **keywords)  # type: ignore[arg-type]
    return p


def run(args: argparse.Namespace, config: Config, stop: threading.Event) -> int:
    client = Client(config)
    attempts = 1 if args.once else args.retries
    if args.cmd == "register":
        # vast sets VAST_CONTAINERLABEL (C.<id>) in every container; the launch label wins as
        # the name, the container label still tells the id (the controller links it too)
        vast_id = args.vast_id or _vast_id(config.label) or _vast_id(config.container_label)
        body = {"label": config.label, "vast_id": vast_id, "min_rate": args.min_rate,
                "host_and_port": args.host_and_port, "agent_version": VERSION}  # fmt: skip
        with_retries(lambda: client.post("/v1/instances/register", body), attempts, stop)
        log.info("registered as %s", config.label)
        return 0
    if args.cmd == "stage":
        return _stage(client, args, attempts, stop)
    if args.cmd == "heartbeat-loop":
        supervisor = Supervisor(config.supervisorctl, config.program)
        return loop(Heartbeats(client, supervisor).once, args.interval, args.once, stop)
    tailer = Tailer(args.file, args.state)
    return loop(lambda: push_new_lines(client, tailer), args.interval, args.once, stop)


def _stage(client: Client, args: argparse.Namespace, attempts: int, stop: threading.Event) -> int:
    if args.stage == "bench-done" and args.rate is None:
        raise ConfigError("bench-done needs --rate (proofs/hour)")
    body = {"rate": args.rate} if args.stage == "bench-done" else {}
    path = client.instance_path(args.stage)
    try:
        with_retries(lambda: client.post(path, body), attempts, stop)
    except Refused as exc:
        if exc.status != 409:
            raise
        log.warning("the controller already has a later stage: %s", exc)
        return 0
    log.info("reported %s", args.stage)
    return 0


def _vast_id(label: str) -> str | None:
    m = re.fullmatch(r"C\.(\d+)", label)
    return m[1] if m else None


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="fleetgate-agent %(levelname)s: %(message)s")  # fmt: skip
    args = parser().parse_args(argv)
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    try:
        return run(args, load_config(args, os.environ if environ is None else environ), stop)
    except AgentError as exc:
        log.error("%s", exc)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
