"""Each room of the controller keeps its "must not" (the `__init__` docstrings), and no two
modules import each other, directly or around a circle.

Every `import` counts, at module level or inside a function, except those under
`if TYPE_CHECKING:` (never run)."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("controller", "escalation")

IO = ("time", "datetime", "socket", "ssl", "http", "urllib", "requests", "sqlite3", "psycopg",
      "random", "secrets", "os", "subprocess", "threading", "logging", "durable", "apscheduler",
      "fastapi", "uvicorn", "jinja2")  # fmt: skip
ROOMS = ("rules", "store", "fleet", "service", "sim", "tools")

# room -> (forbidden import prefixes, allowed exceptions)


def rooms(*names: str) -> tuple[str, ...]:
    """The controller's rooms by short name (`escalation` is its own package)."""
    return tuple(n if n == "escalation" else f"controller.{n}" for n in names)


NETWORK_AND_DATABASE = ("requests", "sqlite3", "psycopg", "socket", "http", "urllib")

# room -> (forbidden import prefixes, allowed exceptions)
MUST_NOT: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "controller.core": (IO + rooms(*ROOMS, "escalation"), ()),
    "controller.rules": (
        rooms("store", "fleet", "service", "sim", "tools", "escalation") + NETWORK_AND_DATABASE,
        (),
    ),
    "controller.store": (
        rooms("rules", "fleet", "service", "sim", "tools", "escalation") + ("requests", "durable"),
        (),
    ),
    "controller.fleet": (
        rooms("core.decide", "core.guards", "rules", "service", "sim", "tools", "escalation")
        + ("durable",),
        (),
    ),
    "controller.sim": (rooms("service", "tools", "rules", "escalation") + ("durable",), ()),
    "controller.service": (("durable", "controller.tools"), ()),
    "escalation": (
        rooms("service", "sim", "tools", "fleet", "rules.engine") + ("durable",),
        ("controller.fleet.retry",),
    ),
}
# modules held to more than their room
EXTRA: dict[str, tuple[str, ...]] = {
    "controller.fleet.curio": ("controller.fleet.actuator",),  # sensors never act
    "controller.fleet.health": ("controller.fleet.actuator",),
    "controller.fleet.observe": ("controller.fleet.actuator", "controller.fleet.actions"),
}
# the one module of a room allowed past one of its rules
PASSES = {
    ("controller.service.cli", "controller.tools"),  # the CLI is the front door to the tools
    ("controller.rules.engine", "durable"),  # the only importer of durable_rules
}


def _modules() -> Iterator[tuple[str, Path]]:
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            yield ".".join(parts), path


def _type_checking_only(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in node.body:
                skip |= {id(n) for n in ast.walk(sub)}
    return skip


def imports_of(source: str, name: str = "<module>") -> set[str]:
    """Every module `source` imports (for `from a import b`: `a` and `a.b`)."""
    tree = ast.parse(source, name)
    skip = _type_checking_only(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def violations(module: str, imported: set[str]) -> list[str]:
    """What `module` imports that its room (or its own rule) forbids."""
    out = []
    for room, (forbidden, allowed) in MUST_NOT.items():
        if not _under(module, room):
            continue
        for imp in sorted(imported):
            if any(_under(imp, a) for a in allowed):
                continue
            hit = next((f for f in forbidden if _under(imp, f)), None)
            if hit and not _under(imp, room) and (module, hit) not in PASSES:
                out.append(f"{module} imports {imp} ({room} must not import {hit})")
    for imp in sorted(imported):
        for f in EXTRA.get(module, ()):
            if _under(imp, f):
                out.append(f"{module} imports {imp} (a sensor must not act)")
        rules_room = _under(module, "controller.rules") and _under(imp, "durable")
        if rules_room and (module, "durable") not in PASSES:
            out.append(f"{module} imports {imp} (only controller.rules.engine may)")
    if _under(module, "controller.fleet.agent"):  # standard library only: copied onto images
        for imp in sorted(imported):
            top = imp.split(".")[0]
            if top != "__future__" and top not in sys.stdlib_module_names:
                out.append(f"{module} imports {imp} (the agent is standard library only)")
    return out


def _graph() -> dict[str, set[str]]:
    mods = dict(_modules())
    graph = {}
    for name, path in mods.items():
        imps = imports_of(path.read_text(), str(path))
        graph[name] = {i for i in imps if i in mods and i != name}
    return graph


def test_every_room_keeps_its_must_not() -> None:
    found = []
    for name, path in _modules():
        found += violations(name, imports_of(path.read_text(), str(path)))
    assert not found, "\n".join(found)


def test_every_room_says_what_it_must_not_do() -> None:
    for room in [*MUST_NOT, "controller.tools"]:
        init = ROOT / room.replace(".", "/") / "__init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "must not" in doc.lower() or "never imports" in doc.lower(), room


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        ("controller.core.guards", "import time\n", "must not import time"),
        ("controller.core.decide", "from controller.rules import engine\n", "controller.rules"),
        ("controller.fleet.observe", "from controller.core.guards import check\n", "core.guards"),
        ("controller.fleet.curio", "from controller.fleet import actuator\n", "must not act"),
        ("controller.fleet.agent.fleetgate_agent", "import requests\n", "standard library"),
        ("controller.rules.compile", "import durable.lang\n", "only controller.rules.engine"),
        ("controller.store.journal", "def f():\n    import requests\n", "requests"),
        ("controller.service.tick", "from controller.tools.bench import sim\n", "tools"),
        ("escalation.router", "from controller.fleet import vast\n", "controller.fleet"),
        ("controller.sim.world", "from controller.service import app\n", "service"),
    ],
)
def test_the_check_fails_on_a_deliberate_violation(module: str, source: str,
                                                   expected: str) -> None:  # fmt: skip
    found = violations(module, imports_of(source))
    assert found and expected in found[0], found


def test_a_passes_and_type_checking_imports_are_not_violations() -> None:
    assert not violations("controller.service.cli", imports_of("import controller.tools.bench"))
    assert not violations("controller.rules.engine", imports_of("import durable.lang"))
    guarded = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import requests\n"
    assert not violations("controller.core.model", imports_of(guarded))
    assert not violations("escalation.channels.http", imports_of("import controller.fleet.retry"))


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 5000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles() -> None:
    # a package's __init__ re-exporting its own modules is not a circle
    graph = {m: {i for i in imps if not _under(m, i)} for m, imps in _graph().items()}
    assert not _cycles(graph)


def test_the_circle_check_finds_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
