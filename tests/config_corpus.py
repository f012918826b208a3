"""The config corpus (`tests/data/config/good` and `bad`) and the environment it is read in.

A bad file says what it expects in `# expect: LINE: TEXT` comments: a line
`path:LINE: key: ...TEXT...` of the `ConfigError`. LINE 0 is an error only building the
controller finds (a templates folder or rules path that does not exist): it names the file and
the key, `path: key: ...TEXT...`, and the file itself loads.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support import EXPECT, PG_DSN, ROOT, read, rel

DATA = ROOT / "tests" / "data" / "config"
GOOD = sorted((DATA / "good").glob("*.yaml"))
BAD = sorted((DATA / "bad").glob("*.yaml"))
EXAMPLES = sorted((ROOT / "controller" / "examples").glob("*.yaml"))

# Every secret the corpus, the shipped examples and the README name, with a value of its kind.
ENV = {
    "VAST_API_KEY": "corpus-vast-key-0123456789",
    "CURIO_DSN": "host=127.0.0.1 port=5432 dbname=test user=postgres",
    "FLEETGATE_FLEET_TOKEN": "corpus-fleet-token-0123",
    "FLEETGATE_API_TOKEN": "corpus-api-token-0123",
    "FLEETGATE_JOURNAL_DSN": PG_DSN,
    "FLEETGATE_LLM_KEY": "sk-corpus-0123456789",
    "FLEETGATE_WEBHOOK_URL": "https://hooks.example.org/fleetgate/corpus-0123",
    "FLEETGATE_WEBHOOK_AUTH": "Bearer corpus-webhook-0123",
    "HOOK_AUTH": "Bearer corpus-hook-0123",
    "SLACK_WEBHOOK_URL": "https://hooks.slack.example/services/T0/B0/corpus-0123",
    "SMTP_PASSWORD": "corpus-smtp-0123",
    "NTFY_TOKEN": "tk_corpus0123",
    "PD_ROUTING_KEY": "corpus-routing-key-0123",
    "REGISTRY_TOKEN": "corpus-registry-0123",
    "FG_CORPUS_NOT_A_URL": "not a url",
}
UNSET = ("FG_CORPUS_UNSET",)


def corpus_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The process environment the corpus is read in (the CLI reads os.environ)."""
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    for name in UNSET:
        monkeypatch.delenv(name, raising=False)


def expectations(path: Path) -> list[tuple[int, str]]:
    found = [(int(m[1]), m[2].strip()) for m in EXPECT.finditer(read(path))]
    assert found, f"{rel(path)}: a bad file needs at least one '# expect: LINE: TEXT' comment"
    return found


def loads(path: Path) -> bool:
    """Does the bad file load, failing only when the controller is built (LINE 0)?"""
    return all(line == 0 for line, _ in expectations(path))


def unmatched(name: str, expected: list[tuple[int, str]], message: str) -> list[str]:
    """What is wrong with `message` against `expected`: a missing line, or one too many."""
    lines = message.splitlines()
    problems = []
    for line, text in expected:
        head = f"{name}: " if line == 0 else f"{name}:{line}: "
        hit = next((x for x in lines if x.startswith(head) and text in x), None)
        if hit is None:
            problems.append(f"no line {head}...{text}...")
        else:
            lines.remove(hit)
    return problems + [f"unexpected: {x}" for x in lines]
