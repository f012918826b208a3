"""BENCHMARKS.md's command blocks, pasted in a copy of the repository's root in the order
printed: every preparing step (mkdir, cp, sed, awk, printf, for) runs and reads only what the
repository ships or an earlier step made, every `fleetgate` command's options are the
parser's, and every config it names loads with its rules. The runs themselves are not made."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from controller.service.cli import _parser, main

ROOT = Path(__file__).resolve().parent.parent
STEPS = ("mkdir", "cp", "sed", "awk", "printf", "for", "gzip", "tar")
PROGRAM = ".venv/bin/fleetgate"
# the one step that needs the network, and the file it brings: a stand-in for its SWF log
DOWNLOAD = ".venv/bin/pip download"
SWF = "; a stand-in for the log the download brings\n1 2600000 0 3600 1 -1 -1 1 7200 -1 1\n"
# the placeholders the prose around the blocks names, each with the values it gives
WORLDS = ["simulate", "simulate-no-faults"]
PLACES = {
    "RULES-WORLD": [f"{r}-{w}" for r in ("shipped", "warm") for w in WORLDS],
    "WORLD": WORLDS,
    "V-": ["idle60-", "eager-"],
    "CONFIG": ["controller/examples/simulate.yaml"],
}  # fmt: skip

pytestmark = pytest.mark.usefixtures("restore_logging")  # `main` re-points the root logger


def _blocks(text: str) -> list[list[str]]:
    """The indented code blocks (after a blank line), continuation lines joined."""
    blocks: list[list[str]] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("    ") and line.strip() and (i == 0 or not lines[i - 1].strip()):
            block: list[str] = []
            for more in lines[i:]:
                if more.strip() and not more.startswith("    "):
                    break
                if block and block[-1].endswith("\\"):
                    block[-1] = block[-1][:-1].rstrip() + " " + more.strip()
                elif more.strip():
                    block.append(more[4:])
            blocks.append(block)
    return blocks


def _commands(text: str) -> list[list[str]]:
    """The blocks of commands (not of output or rules), comments left out."""
    out = []
    for block in _blocks(text):
        lines = [line for line in block if not line.lstrip().startswith("#")]
        first = lines[0].split()[0] if lines else ""
        if first in (PROGRAM, "fleetgate", ".venv/bin/pip", *STEPS):
            out.append(lines)
    return out


def _expand(line: str) -> list[str]:
    for place, values in PLACES.items():
        if place in line:
            return [x for v in values for x in _expand(line.replace(place, v))]
    return [line]


def _run_steps(lines: list[str], where: Path) -> None:
    steps = []
    for line in lines:
        if line.startswith(DOWNLOAD):
            name, version = line.split()[-1].split("==")
            (where / f"{name}-{version}.tar.gz").touch()
        elif line.startswith("tar ") and (where / line.split()[2]).is_file():
            swf = where / line.split()[3]  # the member the step extracts, as the archive holds it
            swf.parent.mkdir(parents=True, exist_ok=True)
            swf.write_text(SWF)
        elif not line.startswith((PROGRAM, "fleetgate ")):
            steps.append(line)
    script = "set -euo pipefail\n" + "\n".join(steps)
    done = subprocess.run(
        ["bash", "-c", script], cwd=where, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, (steps, done.stderr)


def _check_command(line: str, where: Path) -> None:
    words = line.split("#")[0].split()
    # `fleetgate` alone is no command after `make .venv/.installed`, nor what the README prints
    assert words[0] == PROGRAM, f"not {PROGRAM}: {line}"
    words = ["1" if w == "S" else w for w in words[1:]]
    try:
        args = _parser().parse_args(words)
    except SystemExit:
        pytest.fail(f"options the parser refuses: {line}")
    if args.command != "simulate":
        return
    for name in (args.simulate_config, getattr(args, "config", None)):
        if name:
            assert (where / name).is_file(), f"{name} is neither shipped nor made: {line}"
            assert main(["--config", str(where / name), "check"]) == 0, line
    if args.trace is not None:
        shipped = ROOT / "controller" / "sim" / "data" / args.trace  # a bare name: the package's
        assert (where / args.trace).is_file() or shipped.is_file(), line


def test_the_benchmarks_commands_run_as_printed_in_a_copy_of_the_repository(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for part in ("rules", "controller/examples", "controller/sim/data"):
        shutil.copytree(ROOT / part, tmp_path / part)
    monkeypatch.chdir(tmp_path)  # rules: [warm_rules] and the like are the working directory's
    blocks = _commands((ROOT / "BENCHMARKS.md").read_text())
    checked = 0
    for lines in blocks:
        _run_steps(lines, tmp_path)
        for line in lines:
            if line.startswith((PROGRAM, "fleetgate")):
                for one in _expand(line):
                    _check_command(one, tmp_path)
                    checked += 1
    capsys.readouterr()
    assert checked >= 40, checked
    slice_ = (tmp_path / "openb-120-124.csv").read_text().splitlines()
    assert slice_[0].startswith("name,") and len(slice_) == 1 + 1004  # BENCHMARKS.md's tasks
    assert len((tmp_path / "gaia-30-37.swf").read_text().splitlines()) == 2
