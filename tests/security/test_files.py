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


def _refused(path: Path, config_text: str) -> str:
    """The `ConfigError` loading `config_text` gives as a user who may not read `path` (its
    mode 0600, root's): this user when not root, else a forked child that became `nobody`."""

    def load() -> str:
        try:
            parse_config("fleetgate.yaml", config_text)
        except ConfigError as exc:
            return str(exc)
        return "loaded"

    path.chmod(0o600)
    if os.geteuid() != 0:
        path.chmod(0o000)
        return load()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to nobody, load, report, leave without pytest's exit
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            os.write(write, load().encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        said = pipe.read().decode()
    os.waitpid(pid, 0)
    return said


def test_a_secret_file_fleetgate_may_not_read_names_the_user_that_must(tmp_path: Path) -> None:
    """A secret file only root may read, loaded as the service's user: the message says what
    the system said and which user must be able to read it (a Python class name before)."""
    import pwd

    secret = tmp_path / "token"
    secret.write_text("api-token-0123456789\n")
    said = _refused(secret, f"api: {{token: {{file: {secret}}}}}\n")
    user = "nobody" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    assert said == (
        f"fleetgate.yaml:1: api.token: cannot read secret file {secret}: Permission denied "
        f"(fleetgate runs as user {user}: make the file, and its folders, readable by it)"
    )
    assert "api-token-0123456789" not in said


def test_a_secret_file_that_is_missing_says_so_in_words(tmp_path: Path) -> None:
    text = f"api: {{token: {{file: {tmp_path / 'nope'}}}}}\n"
    with pytest.raises(ConfigError) as caught:
        parse_config("fleetgate.yaml", text)
    assert str(caught.value) == (f"fleetgate.yaml:1: api.token: cannot read secret file "
                                 f"{tmp_path / 'nope'}: No such file or directory")  # fmt: skip
