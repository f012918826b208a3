"""The README's action table is the descriptors' table, row for row."""

from __future__ import annotations

import re
from pathlib import Path

from controller.core.actions import DESCRIPTORS, table
from controller.core.facts import FIELDS

README = Path(__file__).resolve().parent.parent / "README.md"
HEADER = "| action | parameters |"


def readme_table() -> str:
    """The README's one table whose header starts with HEADER, as its lines."""
    lines = README.read_text(encoding="utf-8").splitlines()
    starts = [n for n, line in enumerate(lines) if line.startswith(HEADER)]
    assert len(starts) == 1, f"README.md has {len(starts)} action tables, expected one"
    rows = []
    for line in lines[starts[0] :]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return "\n".join(rows) + "\n"


def test_the_readme_table_is_the_descriptors_table() -> None:
    assert readme_table() == table(), (
        "README.md's action table differs from controller.core.actions.table(); paste "
        "`python -c 'from controller.core.actions import table; print(table())'` over it"
    )


def test_the_table_has_one_row_per_action_with_every_field() -> None:
    rows = table().splitlines()[2:]
    assert [r.split("|")[1].strip() for r in rows] == [f"`{n}`" for n in DESCRIPTORS]
    assert all(len(r.split("|")) == len(rows[0].split("|")) for r in rows)


def test_the_readme_names_every_fact_field_a_rule_may_match() -> None:
    """The README's **Fields** paragraph names each field of `controller.core.facts.FIELDS`
    under its own kind (`demand`'s id is not `instance`'s)."""
    text = README.read_text(encoding="utf-8")
    start = text.index("- **Fields** per kind:")
    para = text[start : text.index("\n- **", start + 1)]
    parts = re.split(r"`(instance|demand|fleet|sensor)`:", para)
    sections = dict(zip(parts[1::2], parts[2::2], strict=True))
    assert set(sections) == set(FIELDS), sorted(sections)
    missing = {f"{kind}.{name}" for kind, names in FIELDS.items() for name in names
               if name not in set(re.findall(r"[a-z_0-9]+", sections[kind]))}  # fmt: skip
    assert not missing, f"README.md's Fields paragraph leaves out {sorted(missing)}"
