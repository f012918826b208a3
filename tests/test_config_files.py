"""Config files as operators write them (STYLE habits 3 and 4).

`tests/data/config/good/*.yaml` parse, and every value written arrives in the `Config`;
`tests/data/config/bad/*.yaml` each say, in `# expect: LINE: TEXT` comments, which
`path:LINE: key: ...TEXT...` lines the `ConfigError` must hold (and no others). A file with a
`# xfail: REASON` comment shows a known loader bug: its expectations say what *should* happen.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from support import EXPECT, cases, read, rel

from controller.service import cli
from controller.service.config import Config, ConfigError, load_config, parse_config

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "config"
GOOD = sorted((DATA / "good").glob("*.yaml"))
BAD = sorted((DATA / "bad").glob("*.yaml"))


def assert_within(written: Any, loaded: Any, where: str = "config") -> None:
    """Every value the file wrote is the value the Config holds (nothing silently dropped)."""
    if isinstance(written, dict):
        assert isinstance(loaded, dict), where
        for key, value in written.items():
            assert key in loaded, f"{where}.{key}"
            assert_within(value, loaded[key], f"{where}.{key}")
    else:
        assert loaded == written, where


@pytest.mark.parametrize("path", GOOD, ids=lambda p: p.stem)
def test_good_config_file_parses(path: Path) -> None:
    text = read(path)
    config = parse_config(rel(path), text)
    assert isinstance(config, Config)
    assert_within(yaml.safe_load(text) or {}, config.model_dump())


def test_empty_config_is_the_defaults() -> None:
    assert parse_config(rel(DATA / "good" / "empty.yaml"), "") == Config()


@pytest.mark.parametrize("path", cases(BAD))
def test_bad_config_file_reports_its_error(path: Path) -> None:
    name = rel(path)
    expected = [(int(m[1]), m[2].strip()) for m in EXPECT.finditer(read(path))]
    assert expected, "a bad file needs at least one '# expect: LINE: TEXT' comment"
    with pytest.raises(ConfigError) as caught:
        parse_config(name, read(path))
    lines = str(caught.value).splitlines()
    unmatched = list(lines)
    for line, text in expected:
        hit = next((x for x in unmatched if x.startswith(f"{name}:{line}: ") and text in x), None)
        assert hit is not None, f"no line {name}:{line}: ...{text}... in:\n" + "\n".join(lines)
        unmatched.remove(hit)
    assert not unmatched, "unexpected lines:\n" + "\n".join(unmatched)


def test_bad_folder_holds_the_errors_the_brief_lists() -> None:
    assert {
        "unknown_top_level_key",
        "unknown_nested_key",
        "wrong_type",
        "out_of_range",
        "bad_enum",
        "invalid_yaml",
    } <= {p.stem for p in BAD}


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(str(tmp_path / "nope.yaml"))
    assert str(caught.value) == f"{tmp_path / 'nope.yaml'}: cannot read: No such file or directory"


def test_load_config_reads_the_file(tmp_path: Path) -> None:
    path = tmp_path / "fleetgate.yaml"
    path.write_text("gate: {mode: observe}\n", encoding="utf-8")
    assert load_config(str(path)).gate.mode == "observe"


def test_config_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("# café\ninterval_s: 1\n".encode("latin-1"))
    with pytest.raises(ConfigError) as caught:
        load_config(str(path))
    assert str(caught.value).startswith(f"{path}:")


@pytest.mark.usefixtures("restore_logging")
def test_check_with_bad_config(capsys: pytest.CaptureFixture[str], monkeypatch: Any) -> None:
    monkeypatch.chdir(ROOT)
    bad = "tests/data/config/bad/bad_enum.yaml"
    assert cli.main(["--config", bad, "check", "rules"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"{bad}:3: gate.mode: Input should be 'observe', 'propose' or 'act'\n"


@pytest.mark.usefixtures("restore_logging")
def test_check_with_good_config(capsys: pytest.CaptureFixture[str], monkeypatch: Any) -> None:
    monkeypatch.chdir(ROOT)
    assert cli.main(["--config", "tests/data/config/good/minimal.yaml", "check", "rules"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("ok: ") and err == ""


@pytest.mark.parametrize("name", ["sim.yaml", "vast-curio.yaml"])
def test_the_shipped_example_configs_load(name: str) -> None:
    path = ROOT / "controller" / "examples" / name
    config = parse_config(str(path), read(path))
    assert config.provider in ("sim", "vast")
