"""The decision core imports no network, database or clock module (DESIGN: decisions are pure)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from test_layers import imports_of

ROOT = Path(__file__).resolve().parent.parent
CORE = (
    "controller.core.decide",
    "controller.core.guards",
    "controller.rules.rulebook",
    "controller.core.sanity",
    "escalation.situation",
)
FORBIDDEN = {
    "time", "datetime", "socket", "ssl", "http", "urllib", "requests", "sqlite3", "psycopg",
    "random", "secrets", "os", "subprocess", "threading", "durable", "apscheduler", "logging",
    "controller.store", "controller.rules.engine", "controller.service", "controller.fleet",
    "controller.sim",
}  # fmt: skip


def _imports(module: str) -> set[str]:
    path = ROOT / (module.replace(".", "/") + ".py")
    if not path.exists():
        path = ROOT / module.replace(".", "/") / "__init__.py"
    return imports_of(path.read_text(), str(path))


def _closure(start: tuple[str, ...]) -> dict[str, set[str]]:
    """Every project module reachable from `start`, with what each imports."""
    seen: dict[str, set[str]] = {}
    todo = list(start)
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        seen[mod] = _imports(mod)
        for imp in seen[mod]:
            if (
                imp.split(".")[0] in ("controller", "escalation")
                and (ROOT / (imp.replace(".", "/") + ".py")).exists()
                or (ROOT / imp.replace(".", "/") / "__init__.py").exists()
            ):
                todo.append(imp)
    return seen


def _forbidden(name: str) -> bool:
    return any(name == f or name.startswith(f + ".") for f in FORBIDDEN)


def test_decision_core_and_everything_it_imports_from_the_project_stay_pure() -> None:
    closure = _closure(CORE)
    assert set(CORE) <= set(closure)
    offenders = {m: sorted(i for i in imps if _forbidden(i)) for m, imps in closure.items()}
    offenders = {m: i for m, i in offenders.items() if i}
    assert not offenders, f"the pure core imports I/O or clock modules: {offenders}"


def test_the_purity_check_catches_an_offender(tmp_path: Path) -> None:
    assert _forbidden("time") and _forbidden("controller.store.journal") and _forbidden("os.path")
    assert not _forbidden("timeit_like") and not _forbidden("controller.core.model")
    assert any(_forbidden(i) for i in _imports("controller.service.tick"))  # the shell does I/O


def test_importing_the_core_loads_no_database_http_scheduler_or_rule_engine() -> None:
    code = (
        "import sys\n"
        "import controller.core.decide, controller.core.guards, controller.rules.rulebook\n"
        "bad = ('requests', 'sqlite3', 'psycopg', 'durable', 'durable_rules_engine', "
        "'apscheduler', 'controller.store.journal', 'controller.rules.engine')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in bad or m in bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=ROOT)  # fmt: skip
    assert out.stdout.strip() == "[]", out.stdout


def test_only_the_engine_adapter_imports_durable_rules() -> None:
    importers = []
    for path in sorted((ROOT / "controller").rglob("*.py")) + sorted(
        (ROOT / "escalation").rglob("*.py")
    ):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        if any(i == "durable" or i.startswith("durable.") for i in _imports(module)):
            importers.append(module)
    assert importers == ["controller.rules.engine"]
