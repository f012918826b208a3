"""No configured secret appears in any prompt, message, log line or journal row.

A real `fleetgate run` (DEBUG logging) with every channel configured against live local
servers, the LLM included, and every secret given through the environment. Then everything
that came out is scanned: the prompts the LLM received, every message body each channel sent,
the console, the JSONL file, the log on stderr, and a dump of every journal table. Secrets
travel only where their protocol needs them (an Authorization header, a URL path, PagerDuty's
`routing_key` field), and those places are checked to hold them, so the scan is not vacuous.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword
from fakes.openai_server import FakeOpenAI
from fakes.receiver import Receiver
from support import rules_leaving_frozen_to_people

ROOT = Path(__file__).resolve().parent.parent
SECRETS = {
    "FG_LLM_KEY": "sk-llm-SECRET-1111",
    "FG_API_TOKEN": "api-SECRET-2222",
    "FG_SMTP_PASSWORD": "smtp-SECRET-5555",
    "FG_NTFY_TOKEN": "ntfy-SECRET-6666",
    "FG_PD_KEY": "pd-SECRET-7777",
}
WEBHOOK_PATH, SLACK_PATH = "whk-SECRET-3333", "slk-SECRET-4444"
NEEDLES = [*SECRETS.values(), WEBHOOK_PATH, SLACK_PATH]


@dataclass
class Mailbox:
    messages: list[bytes] = field(default_factory=list)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.messages.append(envelope.content)
        return "250 OK"

    def authenticate(self, server: Any, session: Any, envelope: Any, mechanism: str,
                     data: Any) -> AuthResult:  # fmt: skip
        ok = (
            isinstance(data, LoginPassword)
            and data.password.decode() == SECRETS["FG_SMTP_PASSWORD"]
        )
        return AuthResult(success=ok, handled=False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def mailbox() -> Iterator[tuple[Mailbox, int]]:
    box, port = Mailbox(), free_port()
    server = Controller(box, hostname="127.0.0.1", port=port, authenticator=box.authenticate,
                        auth_require_tls=False)  # fmt: skip
    server.start()
    try:
        yield box, port
    finally:
        server.stop()


def config_text(llm: str, rx: str, ntfy: str, smtp_port: int, api_port: int) -> str:
    return f"""
interval_s: 0.01
escalation:
  llm: {{base_url: '{llm}', model: fake-model, api_key: {{env: FG_LLM_KEY}}, retries: 0,
        require_check: false}}
  channels:
    - console
    - file
    - {{type: webhook, url: {{env: FG_WEBHOOK_URL}}}}
    - {{type: slack, webhook_url: {{env: FG_SLACK_URL}}}}
    - {{type: email, host: 127.0.0.1, port: {smtp_port}, security: none, username: fleetgate,
       password: {{env: FG_SMTP_PASSWORD}}, sender: fg@example.org, recipients: [ops@example.org]}}
    - {{type: ntfy, url: '{ntfy}', topic: fleet, token: {{env: FG_NTFY_TOKEN}}}}
    - {{type: pagerduty, routing_key: {{env: FG_PD_KEY}}, url: '{rx}/pagerduty'}}
    - {{type: alertmanager, url: '{rx}/am'}}
api: {{listen: '127.0.0.1:{api_port}', token: {{env: FG_API_TOKEN}}}}
"""


def leaks(where: str, text: str) -> list[str]:
    return [f"{where}: {n}" for n in NEEDLES if n in text]


def test_no_secret_in_prompts_messages_logs_or_the_journal(
    tmp_path: Path, mailbox: tuple[Mailbox, int]
) -> None:
    box, smtp_port = mailbox
    with FakeOpenAI(default="never_tools") as llm, Receiver() as rx, Receiver() as ntfy:
        cfg = tmp_path / "fleetgate.yaml"
        rules = rules_leaving_frozen_to_people(tmp_path / "rules")  # something to escalate
        text = config_text(llm.url, rx.url, ntfy.url, smtp_port, free_port())
        cfg.write_text(f"rules: ['{rules}']\n" + text)
        env = dict(os.environ, **SECRETS, FG_WEBHOOK_URL=f"{rx.url}/hook/{WEBHOOK_PATH}",
                   FG_SLACK_URL=f"{rx.url}/slack/{SLACK_PATH}")  # fmt: skip
        state = tmp_path / "state"
        main = "import sys; from controller.service.cli import main; sys.exit(main())"
        cmd = [sys.executable, "-c", main,
               "--config", str(cfg), "--state", str(state), "--log-level", "DEBUG",
               "run", "--ticks", "40", "--seed", "7"]  # fmt: skip
        out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        requests = list(rx.requests)
        ntfy_requests = list(ntfy.requests)  # ntfy takes a JSON publish at its root only
        prompts = json.dumps(llm.chat_bodies)
        llm_headers = [r.headers for r in llm.requests]

    # it really ran: an escalation reached every channel and the LLM was asked
    assert "ESCALATION #" in out.stdout and prompts != "[]"
    by_path = {p: [r for r in requests if r.path.startswith(p)] for p in
               ("/hook/", "/slack/", "/pagerduty", "/am")}  # fmt: skip
    by_path["/ntfy"] = ntfy_requests
    assert all(by_path.values()), {p: len(v) for p, v in by_path.items()}
    assert all(r.path == "/" for r in ntfy_requests)
    assert box.messages

    # secrets went only where their protocols need them
    assert all(h.get("Authorization") == f"Bearer {SECRETS['FG_LLM_KEY']}" for h in llm_headers)
    assert all(WEBHOOK_PATH in r.path for r in by_path["/hook/"])
    assert all(r.headers.get("Authorization") == f"Bearer {SECRETS['FG_NTFY_TOKEN']}"
               for r in by_path["/ntfy"])  # fmt: skip
    pd_bodies = [r.json for r in by_path["/pagerduty"]]
    assert all(b.pop("routing_key") == SECRETS["FG_PD_KEY"] for b in pd_bodies)

    found = leaks("prompts", prompts)
    for r in [*requests, *ntfy_requests]:
        body = json.dumps(r.json) if not r.path.startswith("/pagerduty") else ""
        found += leaks(f"message body {r.path[:12]}", body)
    found += leaks("pagerduty bodies", json.dumps(pd_bodies))
    found += [x for m in box.messages for x in leaks("email", m.decode(errors="replace"))]
    found += leaks("console", out.stdout)
    found += leaks("log", out.stderr)
    found += leaks("escalations.jsonl", (state / "escalations.jsonl").read_text())
    dump = "\n".join(sqlite3.connect(state / "journal.db").iterdump())
    assert "INSERT INTO" in dump and "escalations" in dump
    found += leaks("journal", dump)
    assert not found, found
