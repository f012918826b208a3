"""What `fleetgate check` accepts, `fleetgate run` builds; what `run` cannot build, `check`
rejects, with the same one line per problem and never a traceback.

Every file of the config corpus (`config_corpus`) and every shipped example goes through both:
`fleetgate --config FILE check` (the assembly, dry) and the real assembly (`load_config` and
`assemble` on a fresh state directory, the journal opened, as `run` does before its first
tick). A good file passes both; a bad one is rejected by `check` (exit 1) with the lines it
expects, fails the real assembly with a `ConfigError` holding the same lines, and `run` and
`tick` print them and exit 2 before writing anything.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any, get_args

import pytest
from config_corpus import BAD, ENV, EXAMPLES, GOOD, corpus_env, expectations, unmatched
from fakes.vast_server import FakeVast
from support import FakeClock, cases, rel

from controller.service import cli
from controller.service.app import App
from controller.service.assemble import PROVIDERS, assemble
from controller.service.channels import CHANNELS, NAMED, Kind
from controller.service.config import (
    CHANNEL_SETTINGS,
    ChannelName,
    Config,
    ConfigError,
    load_config,
    parse_config,
)
from controller.store.backend import PostgresStore

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("restore_logging")


@pytest.fixture(autouse=True)
def _corpus(monkeypatch: pytest.MonkeyPatch) -> None:
    corpus_env(monkeypatch)
    monkeypatch.chdir(ROOT)  # the corpus names paths from the repository's root


def fleetgate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def build(config: Config, state: Path, name: str, rules: list[str] | None = None) -> App:
    """The real assembly, on this test's own PostgreSQL schema when the file names one."""
    if config.journal is not None:
        schema = f"fg_test_corpus_{os.urandom(4).hex()}"
        journal = config.journal.model_copy(update={"schema_name": schema})
        config = config.model_copy(update={"journal": journal})
    return assemble(config, state=state, clock=time.time, sleep=time.sleep, config_path=name,
                    rules=rules)  # fmt: skip


def close(app: App) -> None:
    store = app.journal.store
    try:
        if isinstance(store, PostgresStore):
            store.drop()
    finally:
        app.close()


# the shipped examples name /etc/fleetgate/rules (where operators install them): here, ours
GOOD_FILES = [pytest.param(p, None, id=rel(p)) for p in GOOD] + [
    pytest.param(p, "rules", id=rel(p)) for p in EXAMPLES
]


@pytest.mark.parametrize(("path", "rules"), GOOD_FILES)
def test_a_good_config_passes_check_and_the_real_assembly(
    path: Path, rules: str | None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name, paths = rel(path), [rules] if rules else []
    code, out, err = fleetgate(capsys, "--config", name, "--state", str(tmp_path / "c"), "check",
                               *paths)  # fmt: skip
    assert (code, err) == (0, ""), err
    assert out.startswith("ok: ") and out.count("\n") == 1, out
    assert not (tmp_path / "c").exists(), "a dry assembly wrote to the state directory"
    config = load_config(name)
    app = build(config, tmp_path / "state", name, paths or None)
    try:
        assert not app.dry and app.config.provider == config.provider
        assert len(app.controller.escalator.notifier.channels) == len(config.escalation.channels)
    finally:
        close(app)


@pytest.mark.parametrize("path", cases(BAD))
def test_a_bad_config_is_rejected_by_check_and_by_the_real_assembly(
    path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name, expected = rel(path), expectations(path)
    code, out, err = fleetgate(capsys, "--config", name, "--state", str(tmp_path / "c"), "check")
    assert (code, out) == (1, ""), err
    assert not unmatched(name, expected, err), "\n".join([*unmatched(name, expected, err), err])
    with pytest.raises(ConfigError) as caught:
        build(load_config(name), tmp_path / "state", name)
    assert not unmatched(name, expected, str(caught.value)), str(caught.value)
    for command in (["run", "--ticks", "1"], ["tick"]):
        code, out, err = fleetgate(capsys, "--config", name, "--state", str(tmp_path / "r"),
                                   *command)  # fmt: skip
        assert code == 2 and not unmatched(name, expected, err), err
        assert "Traceback" not in err
    assert not (tmp_path / "r").exists(), "a refused config wrote to the state directory"


def test_check_builds_a_vast_fleet_without_opening_a_connection(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: Any) -> None:
        raise AssertionError(f"check connected to {args[1:]}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setenv("FLEETGATE_JOURNAL_DSN", "host=127.0.0.1 port=1 dbname=nowhere")
    cfg = tmp_path / "fleetgate.yaml"
    text = (ROOT / "tests/data/config/good/vast_curio.yaml").read_text(encoding="utf-8")
    cfg.write_text(text + "journal: {dsn: {env: FLEETGATE_JOURNAL_DSN}}\n", encoding="utf-8")
    code, out, err = fleetgate(capsys, "--config", str(cfg), "check")
    assert (code, err) == (0, ""), err
    assert "provider vast, demand curio, 1 channel(s), no LLM" in out


def test_the_real_provider_gets_the_injected_clock_and_sleep(tmp_path: Path) -> None:
    """The vast client paces by the injected clock and waits with the injected sleep; the
    controller and the LLM client read the same clock."""
    with FakeVast(api_key=ENV["VAST_API_KEY"]) as vast:
        text = f"""
provider: vast
demand: curio
vast: {{api_key: {{env: VAST_API_KEY}}, image: example/cuzk:latest, base_url: '{vast.url}',
        min_interval_s: {{list: 5}}}}
curio: {{dsn: {{env: CURIO_DSN}}}}
instances: {{fleet_token: {{env: FLEETGATE_FLEET_TOKEN}}, shared_token_opt_in: true}}
api: {{token: {{env: FLEETGATE_API_TOKEN}}}}
escalation:
  channels: [console]
  llm: {{base_url: 'http://127.0.0.1:9/v1', model: m, require_check: false}}
"""
        clock, sleeps = FakeClock(), []
        app = assemble(parse_config("c.yaml", text), state=tmp_path, clock=clock,
                       sleep=sleeps.append)  # fmt: skip
        try:
            fleet: Any = app.controller.provider
            assert app.controller.clock is clock and fleet.clock is clock
            fleet.vast.list_instances()
            fleet.vast.list_instances()  # at the same (fake) time: paced by the given sleep
            assert sleeps == [5.0]
            reader: Any = app.controller.escalator.reader
            assert reader._clock is clock and reader._sleep == sleeps.append
            env = fleet.vast._settings.secret_env  # what every instance gets (the opt-in)
            assert env["FLEETGATE_FLEET_TOKEN"].get_secret_value() == ENV["FLEETGATE_FLEET_TOKEN"]
        finally:
            app.close()


def test_a_dry_assembly_keeps_its_journal_in_memory_and_serves_nothing(tmp_path: Path) -> None:
    config = parse_config("c.yaml", "api: {token: {env: FLEETGATE_API_TOKEN}}\n")
    app = assemble(config, state=tmp_path / "s", clock=time.time, sleep=time.sleep, dry=True)
    try:
        assert app.dry and app.journal.path == Path(":memory:")
        with pytest.raises(RuntimeError, match="serves nothing"):
            app.serve_api()
    finally:
        app.close()
    assert not (tmp_path / "s").exists()


def test_the_registries_cover_exactly_what_the_config_accepts() -> None:
    assert set(PROVIDERS) == set(get_args(Config.model_fields["provider"].annotation))
    assert set(NAMED) == set(get_args(ChannelName))
    assert set(CHANNELS) == set(CHANNEL_SETTINGS)
    for kind, builder in CHANNELS.items():
        assert isinstance(builder, Kind) and builder.settings is CHANNEL_SETTINGS[kind]


def test_the_readme_configuration_passes_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Configuration") :]
    block = section[section.index("```yaml\n") + 8 : section.index("```\n", 8)]
    cfg = tmp_path / "fleetgate.yaml"  # its Slack URL file, here: ours
    cfg.write_text(block.replace("/run/secrets/slack_url", "tests/data/config/secrets/slack_url"))
    code, out, err = fleetgate(capsys, "--config", str(cfg), "check", "rules")
    assert (code, err) == (0, ""), err
    assert "provider sim, demand sim, 8 channel(s), LLM 'qwen2.5-32b-instruct'" in out


def test_links_to_this_machines_loopback_are_a_warning_at_check_and_at_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without api.public_url the answer links and ntfy buttons in messages are
    http://<api.listen>: on the default 127.0.0.1 (or 0.0.0.0) no phone or other desktop
    reaches them. `check` and `run` say so; with public_url, or channels that stay on this
    machine, nothing is said."""
    ntfy = "{type: ntfy, url: https://ntfy.example.org, topic: fleet-ops}"
    cases = {
        "loopback.yaml": f"api: {{token: {{env: FLEETGATE_API_TOKEN}}}}\n"
                         f"escalation: {{channels: [console, {ntfy}]}}\n",
        "any.yaml": f"api: {{token: {{env: FLEETGATE_API_TOKEN}}, listen: '0.0.0.0:8765'}}\n"
                    f"escalation: {{channels: [{ntfy}]}}\n",
        "public.yaml": f"api: {{token: {{env: FLEETGATE_API_TOKEN}}, "
                       f"public_url: 'https://fg.example.org'}}\n"
                       f"escalation: {{channels: [{ntfy}]}}\n",
        "local.yaml": "api: {token: {env: FLEETGATE_API_TOKEN}}\n"
                      "escalation: {channels: [console, file]}\n",
    }  # fmt: skip
    said = {}
    for name, text in cases.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
        code, out, err = fleetgate(capsys, "--config", str(tmp_path / name), "--state",
                                   str(tmp_path / "c"), "check")  # fmt: skip
        assert code == 0 and out.startswith("ok: "), err
        said[name] = err
    assert said["loopback.yaml"] == (
        "warning: api.public_url is not set and api.listen is 127.0.0.1:8765: the answer links "
        "and buttons in messages sent by ntfy point at http://127.0.0.1:8765, which no other "
        "device reaches; set api.public_url to the address people reach the API at\n"
    )
    assert "api.listen is 0.0.0.0:8765" in said["any.yaml"]
    assert said["public.yaml"] == said["local.yaml"] == ""
    # `run` binds the API: on a port of its own (8765 may be another fleetgate's on this host)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    running = tmp_path / "running.yaml"
    running.write_text(
        cases["loopback.yaml"].replace("api: {", f"api: {{listen: '127.0.0.1:{port}', ")
    )
    code, _, err = fleetgate(capsys, "--config", str(running), "--state",
                             str(tmp_path / "r"), "run", "--ticks", "1")  # fmt: skip
    assert (
        code == 0 and f"WARNING api.public_url is not set and api.listen is 127.0.0.1:{port}" in err
    )


def test_messages_read_the_api_token_where_the_config_reads_it(tmp_path: Path) -> None:
    # the printed curl lines and the links' pages say ${OPS_TOKEN}, not $FLEETGATE_API_TOKEN
    config = parse_config("c.yaml", "api: {token: {env: OPS_TOKEN}}\n", {"OPS_TOKEN": "t" * 16})
    app = assemble(config, state=tmp_path / "s", clock=time.time, sleep=time.sleep, dry=True)
    try:
        how = app.controller.escalator.how(1)
        assert '"Authorization: Bearer ${OPS_TOKEN}"' in how["approve_http"], how
        assert app.view().how is not None and "t" * 16 not in str(how)
    finally:
        app.close()
