"""Config files as operators write them (STYLE habits 3 and 4).

`tests/data/config/good/*.yaml` parse, and every value written arrives in the `Config` (a
secret as its resolved value); `tests/data/config/bad/*.yaml` each say, in `# expect: LINE:
TEXT` comments, which `path:LINE: key: ...TEXT...` lines the `ConfigError` must hold (and no
others); see `config_corpus`. `test_config_assembly.py` runs the same files through `check`
and the real assembly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from config_corpus import BAD, DATA, ENV, EXAMPLES, GOOD, corpus_env, expectations, loads, unmatched
from pydantic import BaseModel, SecretStr
from support import cases, read, rel

from controller.service import cli
from controller.service.config import Config, ConfigError, load_config, parse_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    corpus_env(monkeypatch)


def assert_within(written: Any, loaded: Any, where: str = "config") -> None:
    """Every value the file wrote is the value the Config holds (nothing silently dropped);
    a secret reference holds the value it names."""
    if isinstance(loaded, BaseModel):
        loaded = dict(loaded)  # its fields as they are (secrets stay SecretStr)
    if isinstance(loaded, SecretStr):
        assert isinstance(written, dict) and set(written) <= {"env", "file"}, where
        expected = ENV[written["env"]] if "env" in written else read(ROOT / written["file"])
        assert loaded.get_secret_value() == expected.strip(), where
    elif isinstance(written, dict):
        assert isinstance(loaded, dict), where
        for key, value in written.items():
            assert key in loaded, f"{where}.{key}"
            assert_within(value, loaded[key], f"{where}.{key}")
    elif isinstance(written, list):
        assert isinstance(loaded, list) and len(loaded) == len(written), where
        for n, (value, held) in enumerate(zip(written, loaded, strict=True)):
            assert_within(value, held, f"{where}.{n}")
    elif isinstance(written, str) and written.startswith(("http://", "https://")):
        assert loaded == written.rstrip("/"), where  # URLs are held without a trailing slash
    else:
        assert loaded == written, where


@pytest.mark.parametrize("path", GOOD, ids=lambda p: p.stem)
def test_good_config_file_parses(path: Path) -> None:
    text = read(path)
    config = parse_config(rel(path), text)
    assert isinstance(config, Config)
    assert_within(yaml.safe_load(text) or {}, dict(config))


def test_empty_config_is_the_defaults() -> None:
    assert parse_config(rel(DATA / "good" / "empty.yaml"), "") == Config()


@pytest.mark.parametrize("path", cases(BAD))
def test_bad_config_file_reports_its_error(path: Path) -> None:
    name = rel(path)
    if loads(path):  # only building the controller finds it (test_config_assembly.py)
        assert isinstance(parse_config(name, read(path)), Config)
        return
    with pytest.raises(ConfigError) as caught:
        parse_config(name, read(path))
    problems = unmatched(name, expectations(path), str(caught.value))
    assert not problems, "\n".join([*problems, "in:", str(caught.value)])


def test_bad_folder_holds_the_errors_the_brief_lists() -> None:
    assert {
        "unknown_top_level_key",
        "unknown_nested_key",
        "wrong_type",
        "out_of_range",
        "bad_enum",
        "invalid_yaml",
        "vast_base_url_ftp",
        "channel_unknown_type",
        "secret_env_unset",
        "negative_interval",
        "vast_negative_interval",
        "llm_base_url",
        "sim_with_curio_demand",
        "vast_unknown_key",
        "llm_unknown_key",
        "channel_unknown_key",
    } <= {p.stem for p in BAD}


def test_a_secret_never_appears_in_an_error() -> None:
    text = "api:\n  token: hunter2-hunter2\nescalation:\n  channels:\n" \
           "    - {type: webhook, url: {env: FG_CORPUS_NOT_A_URL}}\n"  # fmt: skip
    with pytest.raises(ConfigError) as caught:
        parse_config("c.yaml", text)
    assert "hunter2" not in str(caught.value) and ENV["FG_CORPUS_NOT_A_URL"] not in str(
        caught.value
    )


def test_secrets_can_come_from_a_given_environment() -> None:
    text = "api: {token: {env: FG_GIVEN}}\n"
    config = parse_config("c.yaml", text, environ={"FG_GIVEN": "given-token"})
    assert config.api is not None and config.api.token.get_secret_value() == "given-token"
    with pytest.raises(ConfigError, match="c.yaml:1: api.token: environment variable FG_GIVEN"):
        parse_config("c.yaml", text, environ={})


def test_a_secret_s_variable_set_empty_is_said_to_be_empty() -> None:
    """`VAST_API_KEY=` left in the env file: the error said the variable was not set (it is
    there), and a value of spaces passed as an empty key."""
    text = "api: {token: {env: FG_GIVEN}}\n"
    for value in ("", "  "):
        with pytest.raises(ConfigError) as caught:
            parse_config("c.yaml", text, environ={"FG_GIVEN": value})
        assert str(caught.value) == "c.yaml:1: api.token: environment variable FG_GIVEN is empty"


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


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_the_shipped_example_configs_load(path: Path) -> None:
    config = parse_config(str(path), read(path))
    assert config.provider in ("sim", "vast")
