"""The wheel: built offline from the source tree, it carries the rules, templates, examples and
the task traces (with their source and licence), and an installed copy checks its rules from a
directory that is not the repository. In a fresh venv with the wheel installed, the commands
`fleetgate init` prints run as printed, outside the repository."""

from __future__ import annotations

import gzip
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from controller.sim.trace import DATA, load_trace, resolve

ROOT = Path(__file__).resolve().parent.parent
SHARED_TRACE = ROOT.parent / "shared" / "data" / "openb_pod_list_default.csv"
SOURCES = ("controller", "escalation", "rules", "deploy", "pyproject.toml", "README.md")


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
    # deploy/: what the unit's and the cron file's install steps copy from the installed copy
    for f in [*(ROOT / "deploy").glob("fleetgate*"), *(ROOT / "deploy" / "prometheus").glob("*")]:
        assert f"controller/deploy/{f.relative_to(ROOT / 'deploy').as_posix()}" in names, f


def test_the_wheel_carries_every_data_file_of_its_packages(wheel: Path) -> None:
    """Each file beside the modules (SQL, templates, YAML, traces) is installed with them: a
    package-data glob left naming a folder that moved shipped the code without its file."""
    names = set(zipfile.ZipFile(wheel).namelist())
    for package in ("controller", "escalation"):
        for f in (ROOT / package).rglob("*"):
            if f.is_file() and f.suffix not in (".py", ".pyc") and "__pycache__" not in f.parts:
                assert f.relative_to(ROOT).as_posix() in names, f
    assert "controller/fleet/curio_schema.sql" in names  # create_schema reads it


def test_matplotlib_is_an_extra(wheel: Path) -> None:
    meta = next(n for n in zipfile.ZipFile(wheel).namelist() if n.endswith("/METADATA"))
    requires = [
        line
        for line in zipfile.ZipFile(wheel).read(meta).decode().splitlines()
        if line.startswith("Requires-Dist:")
    ]
    plot = [line for line in requires if "matplotlib" in line]
    extras = {line.split("extra ==")[1].strip().strip('"') for line in plot if "extra ==" in line}
    assert len(plot) == 2 and extras == {"simulate", "chart"}, requires  # chart: the old name
    assert not any("matplotlib" in line and "extra" not in line for line in requires)


def test_the_chart_message_names_the_extra() -> None:
    from controller.tools.replay import chart

    assert "pip install 'fleetgate[simulate]'" in chart.MISSING


def test_the_wheel_carries_the_traces_with_their_source_and_licence(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for f in ("openb_pod_list_default.csv.gz", "openb_sample.csv", "README.md"):
        assert f"controller/sim/data/{f}" in names
    note = (DATA / "README.md").read_text()
    assert "alibaba/clusterdata" in note and "## Licence" in note and "Weng" in note


def test_the_shipped_trace_is_the_whole_trace_and_reads_compressed(tmp_path: Path) -> None:
    shipped = DATA / "openb_pod_list_default.csv.gz"
    assert shipped.read_bytes()[:2] == b"\x1f\x8b"  # gzip, not a renamed CSV
    tasks = load_trace(shipped)
    assert len(tasks) == 7064  # the GPU tasks of 8,152 (BENCHMARKS.md)
    if SHARED_TRACE.is_file():  # the copy it was made from, where there is one
        assert gzip.decompress(shipped.read_bytes()) == SHARED_TRACE.read_bytes()
        assert load_trace(SHARED_TRACE) == tasks
    plain = tmp_path / "t.csv"
    plain.write_bytes(gzip.decompress(shipped.read_bytes()))
    assert load_trace(plain) == tasks
    cut = tmp_path / "cut.csv.gz"  # a damaged download is an error naming the file
    cut.write_bytes(shipped.read_bytes()[:40000])
    with pytest.raises(ValueError, match="cut.csv.gz: not a readable gzip file"):
        load_trace(cut)


def test_a_shipped_trace_is_found_by_name_from_any_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for name in ("openb_pod_list_default.csv.gz", "openb_pod_list_default.csv"):
        assert resolve(name) == DATA / "openb_pod_list_default.csv.gz"
    assert resolve("openb_sample.csv") == DATA / "openb_sample.csv"
    assert resolve("elsewhere/openb_sample.csv") == Path("elsewhere/openb_sample.csv")
    (tmp_path / "openb_sample.csv").write_text("name,creation_time,deletion_time,num_gpu\n")
    assert resolve("openb_sample.csv") == Path("openb_sample.csv")  # a file here comes first
    assert load_trace("openb_sample.csv") == []
    with pytest.raises(OSError):
        load_trace("openb_other.csv")


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


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel installed by pip. Its dependencies are this interpreter's
    (a .pth file naming their site-packages: the tests run offline); the source tree's editable
    install is not among them (a path named in a .pth file has its own .pth files ignored)."""
    root = tmp_path_factory.mktemp("venv") / "venv"
    made = subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert made.returncode == 0, made.stderr
    (site,) = (root / "lib").glob("python3*/site-packages")
    deps = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (site / "zz_dependencies.pth").write_text("\n".join(deps) + "\n")
    out = subprocess.run([sys.executable, "-m", "pip", "--python", str(root / "bin" / "python"),
                          "install", "--no-deps", "--no-index", str(wheel)],
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return root


def test_in_a_fresh_venv_init_check_and_run_work_outside_the_repository(
    venv: Path, tmp_path: Path
) -> None:
    ops = tmp_path / "ops"
    ops.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("FLEETGATE_STATE", "PYTHONPATH", "VIRTUAL_ENV")}  # fmt: skip
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"

    def sh(*words: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(words), cwd=ops, env=env, capture_output=True, text=True,
                              timeout=300)  # fmt: skip

    where = sh("python", "-c", "import controller; print(controller.__file__)")
    assert where.stdout.startswith(str(venv)), where.stdout + where.stderr
    assert shutil.which("fleetgate", path=env["PATH"]) == str(venv / "bin" / "fleetgate")
    init = sh("fleetgate", "init", "starter")
    assert init.returncode == 0, init.stderr
    commands = [ln.strip() for ln in init.stdout.splitlines() if ln.startswith("  fleetgate ")]
    ran = {shlex.split(c)[-1] if "run" not in c else "run": sh(*shlex.split(c)) for c in commands}
    assert set(ran) >= {"check", "run"}, commands
    for name, out in ran.items():
        assert out.returncode == 0, f"{name}: {out.stdout[-1500:]}{out.stderr[-3000:]}"
    n = len(list((ROOT / "rules").glob("*.yaml")))
    assert f"in {n} file(s)" in ran["check"].stdout
    assert "stopped after 5 tick(s) (0 failed)" in ran["run"].stderr
    assert (ops / "starter" / "state" / "journal.db").is_file()
    assert sorted(p.name for p in ops.iterdir()) == ["starter"]  # nothing else written here


def test_in_a_fresh_venv_the_config_reference_prints_and_writes_into_no_install(
    venv: Path, tmp_path: Path
) -> None:
    """The README's `python -m controller.tools.config_reference`, run from an install: there is
    no docs/ to rewrite, so it prints the reference (it wrote site-packages/docs/config.md)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    command = [str(venv / "bin" / "python"), "-m", "controller.tools.config_reference"]
    out = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "| `interval_s` |" in out.stdout and "wrote" not in out.stdout
    (site,) = (venv / "lib").glob("python3*/site-packages")
    assert not (site / "docs").exists() and list(tmp_path.iterdir()) == []
