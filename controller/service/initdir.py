"""`fleetgate init DIR`: a starter config and a copy of the shipped rules, to edit.

DIR/fleetgate.yaml runs the built-in simulator as written, with the settings of a real fleet
(vast.ai and Curio) shown commented out beside it; DIR/rules/ holds the shipped rules and their
unit tests (DIR/rules/tests/), which the config names. The config's paths are absolute, so the
commands it prints work from any directory. Files already there are left alone (an `InitError`
naming them, nothing written) unless `force` is given.
"""

from __future__ import annotations

import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

from controller.rules.source import rule_files, shipped_rules

CONFIG_NAME = "fleetgate.yaml"


class InitError(Exception):
    """The directory cannot be written, or would lose files without `force`."""


@dataclass(frozen=True)
class Written:
    config: Path
    rules: list[Path]
    tests: list[Path]

    def next_commands(self, shown: str, program: str = "fleetgate") -> list[str]:
        """What to run next, with the config as `shown` (the path the operator typed) and
        fleetgate as `program` (how the operator's shell finds it)."""
        cfg, run = shlex.quote(shown), shlex.quote(program)
        return [f"{run} --config {cfg} check",
                f"{run} --config {cfg} test-rules",
                f"{run} --config {cfg} run --ticks 5"]  # fmt: skip


def program(started: str, on_path: str | None) -> str:
    """How a shell runs this fleetgate again: `fleetgate` when that name on $PATH (`on_path`)
    is the executable it was `started` as, else that executable's absolute path (a venv's
    fleetgate, /opt/fleetgate/bin/fleetgate, is on no PATH until activated)."""
    if Path(started).name != "fleetgate":  # `python -m ...`: no script of its own to name
        return "fleetgate"
    if on_path is not None and Path(on_path).resolve() == Path(started).resolve():
        return "fleetgate"
    return str(Path(started).absolute())  # pasted from a message, in any directory


def starter_config(folder: Path) -> str:
    """The starter config for `folder` (absolute paths to its state and rules)."""
    root = folder.resolve()
    return _CONFIG.format(state=_yaml_path(root / "state"), rules=_yaml_path(root / "rules"))


def init(folder: Path, *, force: bool = False) -> Written:
    """Write the starter config and the shipped rules with their tests into `folder`."""
    source = shipped_rules()
    rules = rule_files([source])
    tests = rule_files([source / "tests"]) if (source / "tests").is_dir() else []
    config = folder / CONFIG_NAME
    targets = [config, *(folder / "rules" / f.name for f in rules),
               *(folder / "rules" / "tests" / f.name for f in tests)]  # fmt: skip
    there = [t for t in targets if t.exists() or t.is_symlink()]
    if there and not force:
        names = ", ".join(str(t) for t in there[:5]) + (" ..." if len(there) > 5 else "")
        raise InitError(f"{names} already exist(s); nothing written (--force overwrites)")
    try:
        (folder / "rules" / "tests").mkdir(parents=True, exist_ok=True)
        for f in rules:
            shutil.copyfile(f, folder / "rules" / f.name)
        for f in tests:
            shutil.copyfile(f, folder / "rules" / "tests" / f.name)
        config.write_text(starter_config(folder), encoding="utf-8")
    except OSError as exc:
        raise InitError(f"cannot write into {folder}: {exc.strerror or exc}") from exc
    return Written(config, [folder / "rules" / f.name for f in rules],
                   [folder / "rules" / "tests" / f.name for f in tests])  # fmt: skip


def _yaml_path(path: Path) -> str:
    """A path as a YAML scalar (quoted: a path may hold `#`, `: ` or leading spaces)."""
    return '"' + str(path).replace("\\", "\\\\").replace('"', '\\"') + '"'


# Every key is in docs/config.md (generated from controller/service/config.py).
_CONFIG = """\
# fleetgate's config, written by `fleetgate init`. Every key, its type, default and meaning:
# docs/config.md (an installed copy prints it: python -m controller.tools.config_reference).
# Unknown keys and bad values are errors at their line:
#   fleetgate --config THIS_FILE check
#
# The journal (SQLite) and the escalations file live in the state directory; the rules are the
# shipped ones, copied beside this file to edit (their unit tests in rules/tests/:
# `fleetgate --config THIS_FILE test-rules`). A rules edit applies at the next tick.
state_dir: {state}
rules: [{rules}]

# ---- The built-in simulator: a vast-like fleet and a Curio-like proving queue on virtual time.
# For a real fleet, comment out this block, uncomment the one after it, and start with
# gate.mode: propose (below).
interval_s: 0.1                 # real seconds between ticks (the simulator runs fast)
provider: sim
demand: sim
sim:
  seed: 7                       # the same seed replays the same world
  seconds_per_tick: 60          # virtual seconds each tick advances

# ---- A real fleet: vast.ai instances, Curio's queue in YugabyteDB/PostgreSQL, fleetgate agents.
# Secrets are never written here: {{env: NAME}} reads the environment, {{file: PATH}} a file.
#   export VAST_API_KEY=... CURIO_DSN=postgresql://yugabyte:yugabyte@db:5433/yugabyte
#   export FLEETGATE_API_TOKEN=...
# interval_s: 60
# provider: vast
# demand: curio
# vast:
#   api_key: {{env: VAST_API_KEY}}
#   image: ghcr.io/example/cuzk-curio:latest
#   env: {{"-p 9821:9821": "1", FLEETGATE_URL: "https://fleetgate.example.org"}}
#   onstart: "fleetgate-agent register && fleetgate-agent heartbeat-loop &"
#   disk_gb: 250
#   max_dph: 0.90
# curio:
#   dsn: {{env: CURIO_DSN}}
#   schema_name: curio
#   tasks: {{PoRep: 1.0, UpdateProve: 1.0, PSProve: 1.0, WdPost: 1.0, WinPost: 1.0}}
#   allow_drain: true
# instances:
#   health_port: 9821
# api:
#   listen: 127.0.0.1:8765      # loopback: a TLS reverse proxy in front (README: Security)
#   token: {{env: FLEETGATE_API_TOKEN}}
#   public_url: https://fleetgate.example.org

# ---- What it may do alone, and the limits nothing crosses.
gate:
  mode: act                     # a real fleet starts with propose: every action waits for
                                # a person's approval, until the rules have earned act
  confidence_threshold: 0.8     # rule proposals below it are escalated instead
guards:
  min_instances: 0
  max_instances: 30
  max_spend_per_hour: 30.0      # dollars an hour for the whole fleet

# ---- Who hears of what rules cannot decide (slack, email, ntfy, pagerduty, webhook,
# alertmanager: docs/config.md).
escalation:
  channels: [console, file]
"""
