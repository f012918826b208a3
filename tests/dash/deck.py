"""Helpers of the dashboard's tests: a controller on the simulator serving its API on loopback
(the `deck` fixture in conftest.py), whose operator proposes, so the rules' first decisions
wait for a person on an escalation."""

from __future__ import annotations

import html
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from controller.service.api import Servers
from controller.service.app import App
from controller.service.assemble import assemble
from controller.service.config import parse_config
from controller.store.lease import Lease

TOKEN = "dash-operator-token-5b1f0c9e"
HOLDER = "ctl-dash"
CONFIG = (
    "interval_s: 0.01\n"
    "gate: {mode: propose}\n"
    "escalation: {deadline_s: 864000, channels: [file]}\n"
    f"lease: {{holder: {HOLDER}}}\n"
    "api: {listen: '127.0.0.1:0', token: {env: FG_DASH_TOKEN}}\n"
)


@dataclass
class Deck:
    """The running controller (`app`), its API (`base`), and the lease it holds."""

    app: App
    servers: Servers
    lease: Lease

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.servers.port}"

    def tick_until_pending(self, limit: int = 60) -> dict[str, Any]:
        """Ticks until an escalation with a proposal waits on people; that escalation."""
        for _ in range(limit):
            self.app.controller.tick()
            for esc in self.app.journal.escalations.recent(status="pending"):
                if esc["situation"].get("proposals"):
                    return esc
        raise AssertionError(f"no escalation with a proposal in {limit} ticks")

    def sign_in(self, token: str = TOKEN) -> requests.Session:
        s = requests.Session()
        r = s.post(f"{self.base}/login", data={"token": token, "next": "/"},
                   headers={"Origin": self.base}, allow_redirects=False, timeout=10)  # fmt: skip
        assert r.status_code == 303, r.text
        return s


def csrf_of(page: str) -> str:
    """The CSRF value of the first form on `page`."""
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, page[:2000]
    return html.unescape(found.group(1))


def answer_csrf(page: str) -> str:
    """The CSRF value of the page's answer forms (not the sign-out form's)."""
    found = re.search(r'action="/escalations/\d+/answer">\s*<input type="hidden" name="csrf" '
                      r'value="([^"]+)"', page)  # fmt: skip
    assert found, page[:3000]
    return html.unescape(found.group(1))


@contextmanager
def running(state: Path, config: str = CONFIG) -> Iterator[Deck]:
    """A controller over `state` serving its API, holding the lease, for as long as the block."""
    app = assemble(parse_config("dash.yaml", config), state=state, clock=time.time,
                   sleep=time.sleep, seed=7)  # fmt: skip
    held = Lease(app.journal, HOLDER, ttl_s=600, margin_s=1)
    assert held.renew()
    servers = app.serve_api()
    assert servers is not None
    try:
        yield Deck(app, servers, held)
    finally:
        servers.stop()
        app.close()
