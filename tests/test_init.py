"""`fleetgate init DIR`: a starter config on the simulator and the shipped rules with their tests,
the next commands printed and working from elsewhere, nothing overwritten without --force, and
the real-fleet settings it shows commented out a valid config once uncommented."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from controller.rules.source import rule_files, shipped_rules
from controller.service.cli import main
from controller.service.config import Config, parse_config
from controller.service.initdir import CONFIG_NAME, starter_config

ROOT = Path(__file__).resolve().parent.parent
MAIN = "import sys; from controller.service.cli import main; sys.exit(main())"


def fg(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "FLEETGATE_STATE"}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-c", MAIN, *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def test_init_writes_a_config_and_the_rules_and_its_commands_run(tmp_path: Path) -> None:
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    out = fg("init", "ops dir", cwd=work)  # a space: the printed commands quote it
    assert out.returncode == 0, out.stderr
    folder = work / "ops dir"
    source = shipped_rules()
    for f in rule_files([source]):
        assert (folder / "rules" / f.name).read_bytes() == f.read_bytes()
    tests = rule_files([source / "tests"])
    assert tests
    for f in tests:
        assert (folder / "rules" / "tests" / f.name).read_bytes() == f.read_bytes()
    config = parse_config(str(folder / CONFIG_NAME), (folder / CONFIG_NAME).read_text())
    assert config.provider == "sim" and config.demand == "sim"
    assert config.rules == [str((folder / "rules").resolve())]
    assert config.state_dir == str((folder / "state").resolve())
    commands = [line.strip() for line in out.stdout.splitlines() if line.startswith("  fleetgate ")]
    assert [shlex.split(c)[3:] for c in commands] == [["check"], ["test-rules"],
                                                       ["run", "--ticks", "5"]]  # fmt: skip
    for command in commands:  # from work, exactly as printed
        words = shlex.split(command)
        assert words[0] == "fleetgate"
        ran = fg(*words[1:], cwd=work)
        assert ran.returncode == 0, f"{command}: {ran.stdout[-1000:]}{ran.stderr[-2000:]}"
        if words[-1] == "check":
            assert f"in {len(rule_files([source]))} file(s)" in ran.stdout
        if words[-1] == "test-rules":
            assert " passed, 0 failed" in ran.stdout
        if words[-2:] == ["--ticks", "5"]:
            assert "stopped after 5 tick(s) (0 failed)" in ran.stderr
    assert (folder / "state" / "journal.db").is_file()
    assert not (work / ".fleetgate").exists()
    # the config's paths are absolute: its commands work from any directory
    status = fg("--config", str(folder / CONFIG_NAME), "status", "--json", cwd=elsewhere)
    assert status.returncode == 0, status.stderr
    assert '"provider": "sim"' in status.stdout
    assert list(elsewhere.iterdir()) == []


def test_init_keeps_existing_files_unless_forced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], restore_logging: None
) -> None:
    folder = tmp_path / "ops"
    folder.mkdir()
    mine = "# my own config\ninterval_s: 1\n"
    (folder / CONFIG_NAME).write_text(mine)
    assert main(["init", str(folder)]) == 1
    err = capsys.readouterr().err
    assert "already exist" in err and "--force" in err and CONFIG_NAME in err
    assert (folder / CONFIG_NAME).read_text() == mine
    assert not (folder / "rules").exists()  # nothing written at all
    assert main(["init", str(folder), "--force"]) == 0
    assert (folder / CONFIG_NAME).read_text() == starter_config(folder)
    assert "fleetgate --config" in capsys.readouterr().out
    (folder / "rules" / "scaling.yaml").write_text("rules: []\n")  # an edited rules file
    (folder / CONFIG_NAME).unlink()
    assert main(["init", str(folder)]) == 1
    assert "scaling.yaml" in capsys.readouterr().err
    assert (folder / "rules" / "scaling.yaml").read_text() == "rules: []\n"


def test_init_into_an_unwritable_place_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], restore_logging: None
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["init", str(blocker / "ops")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("fleetgate init: cannot write into") and "Traceback" not in err


def test_the_real_fleet_block_is_a_valid_config_once_uncommented(tmp_path: Path) -> None:
    """Comment out the simulator block, uncomment the vast+Curio one: a config that loads."""
    text = starter_config(tmp_path)
    lines = text.splitlines()

    def block(heading: str) -> list[str]:
        start = next(i for i, ln in enumerate(lines) if ln.startswith(f"# ---- {heading}"))
        end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("# ---- "))
        return lines[start + 1 : end]

    sim = [ln for ln in block("The built-in simulator") if ln and not ln.startswith("#")]
    assert [ln.split("#")[0].strip() for ln in sim[:3]] == [
        "interval_s: 0.1", "provider: sim", "demand: sim"]  # fmt: skip
    code = [ln[2:] for ln in block("A real fleet") if ln.startswith("# ") and
            not ln.startswith(("#   export", "# Secrets"))]  # fmt: skip
    kept = [ln for ln in lines if ln not in sim]
    at = kept.index(next(ln for ln in kept if ln.startswith("# ---- What it may do")))
    swapped = "\n".join(kept[:at] + code + kept[at:]) + "\n"
    env = {"VAST_API_KEY": "k", "CURIO_DSN": "postgresql://x@127.0.0.1/db",
           "FLEETGATE_API_TOKEN": "t" * 32}  # fmt: skip
    config = parse_config("fleetgate.yaml", swapped, env)
    assert (config.provider, config.demand, config.interval_s) == ("vast", "curio", 60)
    assert config.vast is not None and config.curio is not None and config.api is not None
    keys = {ln.split(":")[0] for ln in text.splitlines() if ln and ln[0].isalpha()}
    assert keys <= set(Config.model_fields)


def test_the_next_commands_run_when_pasted_from_a_fleetgate_on_no_path(tmp_path: Path) -> None:
    """`/opt/fleetgate/bin/fleetgate init /etc/fleetgate` (the service's install steps) printed
    `fleetgate --config ... check`, which a shell without the venv on its PATH cannot find:
    the commands name the fleetgate that ran, as it was run, unless PATH finds that one."""
    exe = str(Path(sys.executable).with_name("fleetgate"))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    out = subprocess.run([exe, "init", str(tmp_path / "etc")], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    commands = [line.strip() for line in out.stdout.splitlines() if line.startswith("  ")]
    assert len(commands) == 3 and all(c.startswith(f"{exe} --config ") for c in commands)
    check = subprocess.run(["/bin/sh", "-c", commands[0]], env=env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert check.returncode == 0 and check.stdout.startswith("ok: "), check.stderr
    found = {"PATH": f"{Path(exe).parent}:/usr/bin:/bin"}  # on PATH: the short name
    out = subprocess.run([exe, "init", str(tmp_path / "etc2")], env={**env, **found},
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert "\n  fleetgate --config " in out.stdout, out.stdout
