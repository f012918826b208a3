"""docs/config.md is the config reference generated from the models that load the config: it is
current, names every key with a type, default and meaning, and a setting without a meaning
cannot be added."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel, Field

from controller.service.config import Config
from controller.service.initdir import starter_config
from controller.tools import config_reference as ref

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "config.md"


def test_docs_config_md_is_current() -> None:
    assert DOC.read_text(encoding="utf-8") == ref.render(), (
        "docs/config.md is stale: run .venv/bin/python -m controller.tools.config_reference"
    )


def test_the_check_option_says_when_the_file_is_stale(tmp_path: Path) -> None:
    stale = tmp_path / "config.md"
    stale.write_text(ref.render().replace("| `interval_s` |", "| `interval` |"))
    command = [sys.executable, "-m", "controller.tools.config_reference"]
    out = subprocess.run([*command, "--check", "--output", str(stale)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 1 and "is stale" in out.stderr
    wrote = subprocess.run([*command, "--output", str(stale)], cwd=ROOT, capture_output=True,
                           text=True, timeout=120)  # fmt: skip
    assert wrote.returncode == 0 and stale.read_text() == ref.render()


def _rows() -> dict[str, list[str]]:
    rows = {}
    for line in DOC.read_text().splitlines():
        m = re.match(r"^\| `([^`]+)` \| (.*) \|$", line)
        if m:
            rows[m.group(1)] = [c.strip() for c in re.split(r"(?<!\\)\|", m.group(2))]
    return rows


def _keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    return [f"{prefix}{name}" for name in model.model_fields]


def test_every_key_has_a_type_a_default_and_a_meaning() -> None:
    rows = _rows()
    sections = {s.path: s for s in ref.sections()}
    for section in sections.values():
        for name in section.model.model_fields:
            key = f"{section.path}.{name}" if section.path else name
            assert key in rows, key
            kind, default, meaning = rows[key]
            assert kind and default and len(meaning) > 3, (key, rows[key])
    for name in Config.model_fields:  # the top level, and a section for each model key
        assert name in rows
    for path in ("vast", "curio", "instances", "sim", "sim.world", "sim.agents", "gate",
                 "guards", "escalation", "escalation.llm", "api", "journal", "lease",
                 "retention", "escalation.channels[] (type: slack)"):  # fmt: skip
        assert path in sections, path
    assert rows["interval_s"][:2] == ["number (> 0)", "`0.1`"]
    assert rows["vast.api_key"][:2] == ["secret", "required"]
    assert rows["guards.max_instances"][1] == f"`{Config().guards.max_instances}`"
    assert rows["escalation.channels[] (type: slack).webhook_url"][1] == "required"


def test_the_starter_config_uses_only_documented_keys(tmp_path: Path) -> None:
    rows = _rows()
    top = [ln.split(":")[0] for ln in starter_config(tmp_path).splitlines() if ln[:1].isalpha()]
    assert top and all(key in rows for key in top), top


def test_meanings_held_here_are_for_fields_that_need_them() -> None:
    """An entry of MEANINGS for a field that has gained a description (or is gone) is stale."""
    models = {s.model.__name__: s.model for s in ref.sections()}
    for entry in ref.MEANINGS:
        model_name, name = entry.split(".")
        model = models[model_name]
        assert name in model.model_fields, entry
        field = model.model_fields[name]
        assert not field.description and not ref._comment(model, name), entry


def test_a_setting_without_a_meaning_is_refused() -> None:
    class Undocumented(BaseModel):
        documented: int = Field(1, description="has one")
        bare: int = 2

    assert ref.meaning(Undocumented, "documented", Undocumented.model_fields["documented"])
    with pytest.raises(ValueError, match="Undocumented.bare has no description"):
        ref.meaning(Undocumented, "bare", Undocumented.model_fields["bare"])


def test_a_comment_beside_a_field_is_its_meaning() -> None:
    class Commented(BaseModel):
        # how many,
        # at most
        count: int = 3  # per tick
        other: int = 4  # fmt: skip

    assert ref._comment(Commented, "count") == "how many, at most per tick"
    assert ref._comment(Commented, "other") is None


def test_a_choice_s_meaning_names_only_values_the_config_accepts() -> None:
    """A word in backquotes in the meaning of a `one of` key is one of its values, a key, or
    another key's value: never a value no key accepts (email's security once read `ssl`)."""
    rows = _rows()
    values = {v for kind, _, _ in rows.values() for v in re.findall(r"`([^`]+)`", kind)}
    names = {part for key in rows for part in re.split(r"[.\[\] ():]+", key) if part}
    for key, (kind, _, meaning) in rows.items():
        if kind.startswith("one of"):
            for word in re.findall(r"`([^`]+)`", meaning):
                assert word in values or word in names, (key, word)


def test_a_choice_s_meaning_that_names_its_values_names_them_all() -> None:
    """gate.mode's meaning said what `act` and `propose` do, and nothing of `observe`."""
    for key, (kind, _, meaning) in _rows().items():
        if kind.startswith("one of"):
            values = re.findall(r"`([^`]+)`", kind)
            named = [v for v in values if f"`{v}`" in meaning]
            assert not named or named == values, (key, sorted(set(values) - set(named)))
