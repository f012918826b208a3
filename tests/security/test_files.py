"""A path the operator names is read only if it is a regular file, and only so far: `/dev/zero`
as the config or a secret read until memory ran out, and a FIFO blocked for ever."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_cli_ops import fg

from controller.service.config import ConfigError, parse_config


@pytest.mark.parametrize("kind", ["device", "fifo", "large"])
def test_a_config_that_is_no_regular_file_or_too_large_is_one_line(
    kind: str, tmp_path: Path
) -> None:
    path = tmp_path / "fleetgate.yaml"
    if kind == "device":
        path = Path("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)  # nobody writes it: reading it waited for ever
    else:
        path.write_text("# padding\n" * 110_000)  # 1.1 MB of comments
    out = fg("--config", str(path), "check", cwd=tmp_path)
    why = "over 1024 KiB" if kind == "large" else "not a regular file"
    assert (out.returncode, out.stderr.strip()) == (1, f"{path}: cannot read: {why}")


def test_a_secret_file_that_is_no_regular_file_or_too_large_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "token"
    big.write_text("x" * 70_000)
    for path, why in (("/dev/zero", "not a regular file"), (str(big), "over 64 KiB")):
        text = f'api: {{listen: "127.0.0.1:8765", token: {{file: {path}}}}}\n'
        with pytest.raises(ConfigError) as caught:
            parse_config("fleetgate.yaml", text)
        assert str(caught.value) == (
            f"fleetgate.yaml:1: api.token: cannot read secret file {path}: {why}"
        )


def test_a_rules_folder_reads_only_regular_files(tmp_path: Path) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    os.mkfifo(rules / "pipe.yaml")
    (rules / "zero.yaml").symlink_to("/dev/zero")
    (tmp_path / "c.yaml").write_text(f"rules: [{rules}]\n")
    out = fg("--config", str(tmp_path / "c.yaml"), "check", cwd=tmp_path)
    assert (out.returncode, out.stderr.strip()) == (1, f"{rules}: no rules files found")
