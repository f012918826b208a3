"""The dashboard in a real headless browser: Debian's chromium, driven by playwright (pointed at
/usr/bin/chromium; it never downloads a browser). Signs in, opens the dashboard and an
escalation's page, presses Approve, and checks the journal and the next tick. Screenshots are
kept under tests/artifacts/dash/ (their paths are printed)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dash.deck import CONFIG, TOKEN, Deck, running

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts" / "dash"


def _missing(what: str) -> None:
    """Without the browser (or its client) the test cannot run: an error in CI, where `make
    test` installs both, and a skip elsewhere."""
    if os.environ.get("CI"):
        pytest.fail(f"{what} is missing (make test installs it)")
    pytest.skip(f"{what} is missing: `make test` installs it (apt-get install chromium)")


@pytest.fixture
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        _missing(str(CHROMIUM))
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright (the dev extra)")
    with sync_playwright() as pw:
        # root in a container: chromium's sandbox needs user namespaces it may not have
        b = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                               args=["--no-sandbox", "--disable-gpu"])  # fmt: skip
        try:
            yield b
        finally:
            b.close()


def shot(page: Any, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 1000
    print(f"screenshot: {path}")
    return path


ROOT = Path(__file__).resolve().parents[2]
# the shipped rules grow the fleet on their own; this one asks people before a reboot
REBOOT = """\
rules:
  - name: reboot-a-serving-instance
    description: A serving instance is rebooted, once a person has approved it.
    when:
      instance: {stage: running, status: running}
    then: {action: reboot, instance: "{{ instance.id }}"}
    confidence: 0.9
"""


@pytest.fixture
def deck(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Deck]:
    """A controller that grows its fleet alone and proposes reboots to people."""
    monkeypatch.setenv("FG_DASH_TOKEN", TOKEN)
    extra = tmp_path / "reboot.yaml"
    extra.write_text(REBOOT)
    config = CONFIG.replace("gate: {mode: propose}", "gate: {actions: {reboot: propose}}") + (
        f"rules: ['{ROOT / 'rules'}', '{extra}']\n"
    )
    with running(tmp_path / "state", config) as d:
        yield d


def test_sign_in_open_an_escalation_and_approve_it_in_chromium(deck: Deck, browser: Any) -> None:
    esc = deck.tick_until_pending(limit=300)
    for _ in range(3):
        deck.app.controller.tick()
    esc_id = esc["id"]
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)

    page.goto(f"{deck.base}/")
    assert page.url == f"{deck.base}/login"
    shot(page, "1-sign-in")
    page.fill("#token", TOKEN)
    page.click("#sign-in")
    page.wait_for_url(f"{deck.base}/")
    assert page.inner_text("h1") == "Dashboard"
    assert page.locator(f'#escalations a[href="/escalations/{esc_id}"]').count() == 1
    tracks = deck.app.journal.fleet.tracks()
    assert page.locator("#fleet tbody tr").count() == len(tracks)
    shot(page, "2-dashboard")

    [cookie] = [c for c in context.cookies() if c["name"] == "fleetgate_session"]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and TOKEN not in cookie["value"]
    assert page.evaluate("document.cookie") == ""  # no script on the page can read it
    assert TOKEN not in page.content()

    page.click(f'#escalations a[href="/escalations/{esc_id}"]')
    page.wait_for_url(f"{deck.base}/escalations/{esc_id}")
    assert page.inner_text("#status") == "pending"
    proposal = esc["situation"]["proposals"][0]
    assert proposal["reason"] in page.inner_text("#proposals")
    shot(page, "3-escalation")

    page.click("#approve")
    page.wait_for_url(f"{deck.base}/escalations/{esc_id}?answered=approve")
    assert page.inner_text("#status") == "approved"
    assert page.inner_text("#answered-by") == "operator"
    row = deck.app.journal.escalations.escalation(esc_id)
    assert row is not None and row["status"] == "approved" and row["answered_by"] == "operator"
    shot(page, "4-approved")

    deck.app.controller.tick()  # the answer runs through the guards
    page.reload()
    assert page.inner_text("#status") == "executed"
    acts = deck.app.journal.actions.actions_for_escalation(esc_id)
    assert acts and all(a["proposer"] == "human:operator" for a in acts)
    assert page.locator("#outcome tbody tr").count() == len(acts)
    shot(page, "5-executed")

    # a page from elsewhere cannot answer: the browser sends its Origin, which is refused
    other = deck.tick_until_pending(limit=300)
    evil = context.new_page()
    target = f"{deck.base}/escalations/{other['id']}/answer"
    evil.set_content(f'<form method="post" action="{target}"><input name="decision" '
                     'value="deny"><button id="go">go</button></form>')  # fmt: skip
    with evil.expect_navigation():
        evil.click("#go")
    assert "Refused" in evil.content()
    still = deck.app.journal.escalations.escalation(other["id"])
    assert still is not None and still["status"] == "pending"
    assert errors == []  # the pages raised no errors in the browser (CSP included)
    context.close()
