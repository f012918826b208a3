"""The wheel: built offline from the source tree, it carries the rules, templates and examples,
and an installed copy checks its rules from a directory that is not the repository."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("controller", "escalation", "rules", "pyproject.toml", "README.md")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`pip wheel` of a copy of the tree (so the build writes nothing into the repository)."""
    tmp = tmp_path_factory.mktemp("wheel")
    tree = tmp / "src"
    tree.mkdir()
    for name in SOURCES:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(
                src, tree / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__")
            )
        else:
            shutil.copy(src, tree / name)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            str(tmp / "dist"),
            str(tree),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (built,) = (tmp / "dist").glob("fleetgate-*.whl")
    return built


def test_the_wheel_carries_rules_templates_examples_and_the_agent(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for f in (ROOT / "rules").glob("*.yaml"):
        assert f"controller/shipped_rules/{f.name}" in names
    for f in (ROOT / "rules" / "tests").glob("*.yaml"):
        assert f"controller/shipped_rules/tests/{f.name}" in names
    for f in (ROOT / "escalation" / "templates").glob("*.j2"):
        assert f"escalation/templates/{f.name}" in names
    for f in (ROOT / "controller" / "examples").glob("*.yaml"):
        assert f"controller/examples/{f.name}" in names
    assert "controller/fleet/agent/fleetgate_agent.py" in names


def test_matplotlib_is_an_extra(wheel: Path) -> None:
    meta = next(n for n in zipfile.ZipFile(wheel).namelist() if n.endswith("/METADATA"))
    requires = [
        line
        for line in zipfile.ZipFile(wheel).read(meta).decode().splitlines()
        if line.startswith("Requires-Dist:")
    ]
    plot = [line for line in requires if "matplotlib" in line]
    assert plot and all('extra == "chart"' in line for line in plot), requires


def test_an_installed_copy_checks_and_ticks_on_its_own_rules(wheel: Path, tmp_path: Path) -> None:
    target, elsewhere = tmp_path / "site", tmp_path / "ops"
    elsewhere.mkdir()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-index",
            "--target",
            str(target),
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if k not in ("FLEETGATE_STATE",)}
    env["PYTHONPATH"] = str(target)
    where = subprocess.run(
        [sys.executable, "-c", "import controller; print(controller.__file__)"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert where.stdout.startswith(str(target)), where.stdout  # the copy, not the source tree
    script = target / "bin" / "fleetgate"

    def installed(*args: str) -> subprocess.CompletedProcess[str]:
        """The installed `fleetgate`, run outside the source tree."""
        return subprocess.run([sys.executable, str(script), *args], cwd=elsewhere, env=env,
                              capture_output=True, text=True, timeout=300)  # fmt: skip

    check = installed("check")
    assert check.returncode == 0, check.stderr[-3000:]
    n = len(list((ROOT / "rules").glob("*.yaml")))
    assert f"in {n} file(s)" in check.stdout
    tick = installed("--state", "s", "tick")
    assert tick.returncode == 0, tick.stderr[-3000:]
    assert (elsewhere / "s" / "journal.db").is_file()
