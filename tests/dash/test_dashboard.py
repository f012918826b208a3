"""The dashboard and escalation pages on a real loopback server over a simulated fleet: what
they show comes from the journal, they need a session, and their answer forms are refused
without the session's CSRF value or from another origin, and otherwise answer as the JSON
endpoint does (the next tick carries the answer out)."""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

import pytest
import requests
from dash.deck import CONFIG, TOKEN, Deck, answer_csrf, csrf_of, running
from pydantic import SecretStr
from support import ASKS, served

from controller.service.api import create_app
from controller.service.dashboard import COOKIE, SESSION_S, Sessions, View, wants_html
from controller.store import lease
from controller.store.journal import Journal

HTML = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}


def get(s: requests.Session | Any, url: str, **kw: Any) -> requests.Response:
    return s.get(url, headers=HTML, allow_redirects=False, timeout=10, **kw)


def text(page: str) -> str:
    """A page's text without its tags, entities decoded, whitespace folded."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())


def test_pages_need_a_session_and_a_message_link_opens_a_page(deck: Deck) -> None:
    esc = deck.tick_until_pending()
    base = deck.base
    first = get(requests, f"{base}/")
    assert first.status_code == 303 and first.headers["location"] == "/login"
    link = get(requests, f"{base}/escalations/{esc['id']}")  # what a message's link opens
    assert link.status_code == 200 and link.headers["content-type"].startswith("text/html")
    shown = text(link.text)
    assert f"Escalation #{esc['id']}: {esc['kind']} on {esc['subject']}" in shown
    assert "Sign in" in shown and 'name="next" value="/escalations/' in link.text
    proposal = esc["situation"]["proposals"][0]
    assert proposal["reason"] not in shown  # the evidence and proposal need the session
    # API clients still get the JSON state (no Accept: text/html)
    doc = requests.get(f"{base}/escalations/{esc['id']}", timeout=10).json()
    assert doc["id"] == esc["id"] and doc["status"] == "pending" and "situation" not in doc
    missing = get(requests, f"{base}/escalations/{esc['id'] + 1000}")
    assert missing.status_code == 404 and "no escalation" in missing.text.lower()

    wrong = requests.post(f"{base}/login", data={"token": "not-it", "next": "/"},
                          headers={"Origin": base}, allow_redirects=False, timeout=10)  # fmt: skip
    assert wrong.status_code == 401 and COOKIE not in wrong.headers.get("set-cookie", "")
    forged = requests.Session()
    forged.cookies.set(COOKIE, "9999999999.abcd." + "0" * 64)
    assert get(forged, f"{base}/").status_code == 303


def test_the_session_cookie_holds_no_token_and_lapses(deck: Deck) -> None:
    s = deck.sign_in()
    cookie = s.cookies.get(COOKIE)
    assert cookie and TOKEN not in cookie
    r = requests.post(f"{deck.base}/login", data={"token": TOKEN, "next": "/escalations/1"},
                      headers={"Origin": deck.base}, allow_redirects=False, timeout=10)  # fmt: skip
    assert r.headers["location"] == "/escalations/1"
    header = r.headers["set-cookie"].lower()
    assert "httponly" in header and "samesite=strict" in header and TOKEN.lower() not in header
    elsewhere = requests.post(f"{deck.base}/login", headers={"Origin": deck.base},
                              data={"token": TOKEN, "next": "https://evil.example/"},
                              allow_redirects=False, timeout=10)  # fmt: skip
    assert elsewhere.headers["location"] == "/"
    page = get(s, f"{deck.base}/")
    assert page.status_code == 200 and TOKEN not in page.text
    assert page.headers["x-frame-options"] == "DENY"
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    assert page.headers["cache-control"] == "no-store"
    # a session signed with the token lapses after SESSION_S; another token's never counts
    journal_id = deck.app.journal.meta.identity()
    now = [1_000_000.0]
    sessions = Sessions(deck.app.config.api.token, journal_id, lambda: now[0])  # type: ignore[union-attr]
    minted = sessions.mint()
    assert sessions.valid(minted)
    now[0] += SESSION_S + 1
    assert sessions.valid(minted) is None
    other = Sessions(type(deck.app.config.api.token)("another"), journal_id, lambda: 0.0)  # type: ignore[union-attr]
    assert other.valid(minted) is None


ROOT = Path(__file__).resolve().parents[2]


def test_the_dashboard_shows_what_the_journal_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A controller that acts (the fleet grows) and whose rules also ask people."""
    monkeypatch.setenv("FG_DASH_TOKEN", TOKEN)
    asks = tmp_path / "asks.yaml"
    asks.write_text(ASKS)
    config = CONFIG.replace("gate: {mode: propose}\n", "") + (
        f"rules: ['{ROOT / 'rules'}', '{asks}']\n"
    )
    with running(tmp_path / "state", config) as deck:
        _shows_the_journal(deck)


def _shows_the_journal(deck: Deck) -> None:
    j = deck.app.journal
    for _ in range(200):
        deck.app.controller.tick()
        if len(j.fleet.tracks()) >= 3 and j.escalations.recent(status="pending"):
            break
    for _ in range(3):
        deck.app.controller.tick()
    [pending] = j.escalations.recent(status="pending")
    page = get(deck.sign_in(), f"{deck.base}/")
    assert page.status_code == 200, page.text
    shown = text(page.text)
    # escalations, pending first, each linked to its page
    escs = j.escalations.recent(limit=50)
    assert f'href="/escalations/{pending["id"]}"' in page.text
    n_pending = sum(1 for e in escs if e["status"] == "pending")
    assert f"Escalations {n_pending} pending" in shown
    ids = [int(x) for x in re.findall(r'<td><a href="/escalations/(\d+)">', page.text)]
    statuses = {int(e["id"]): e["status"] for e in escs}
    assert ids and set(ids) == set(statuses)
    flags = [statuses[i] != "pending" for i in ids]
    assert flags == sorted(flags)  # pending first
    # the fleet as tracked
    tracks = j.fleet.tracks()
    assert len(tracks) >= 3 and f"Fleet {len(tracks)} instance(s)" in shown
    for t in tracks.values():
        assert f"<td>{t.id}</td><td>{t.machine_id}" in page.text
    spend = last_summary(j)["spend_per_h"]
    assert spend > 0 and f"${spend:.2f}/h" in shown
    # demand per task as the last tick saw it
    last = {"summary": last_summary(j)}
    for q in last["summary"]["demand"]:
        assert (
            f"<tr><td>{q['task']}</td><td>{q['pending']}</td><td>{q['running']}</td>" in page.text
        )
    # with the forecast one boot time ahead, from the journal's demand history
    forecast = [q for q in last["summary"]["demand"] if q["task"] == "all"][0]
    assert forecast["forecast_horizon_s"] > 0
    assert f"<td>{forecast['forecast_pending']} in " in page.text
    # recent actions with who proposed them
    acts = j.actions.recent(30)
    assert acts
    for a in acts[-5:]:
        assert f"<td>{a['id']}</td>" in page.text and a["proposer"] in page.text
    # rules in force, the leader, the budgets
    book = deck.app.controller.rules.book
    assert book.digest in page.text and all(p in page.text for p in book.paths)
    state = lease.read(j, ttl_s=600)
    assert f"{state.holder} (this controller)" in shown and "role here leader" in shown
    guards = deck.app.config.guards
    assert (
        f"<td>instances</td><td>{last['summary']['instances']:g}</td><td>{guards.max_instances:g}</td>"
        in page.text
    )
    assert f"{guards.max_spend_per_hour:g}" in shown
    # autonomy: nothing answered yet, then what the track record's review saved
    assert "No answers to learn from yet" in shown
    from controller.service import autonomy

    j.meta.put(autonomy.KEY, {
        "record": [{"action": "restart_daemon", "kind": "approval", "unchanged": 4,
                    "changed": 1, "denied": 0, "reverted": 0}],
        "suggestions": [{"text": "promote restart_daemon (approval) to act: 4 proposals ..."}],
        "demoted": [{"action": "drain", "kind": "unmatched", "cause": "denied",
                     "why": "bob denied #9"}],
    })  # fmt: skip
    shown = text(get(deck.sign_in(), f"{deck.base}/").text)
    assert "Suggested: promote restart_daemon (approval) to act" in shown
    assert "Demoted to propose: drain (unmatched), denied: bob denied #9" in shown
    assert "restart_daemon approval 4 1 0 0" in shown


def last_summary(j: Journal) -> dict[str, Any]:
    summary: dict[str, Any] = j.meta.ticks(1)[0]["summary"]
    return summary


def test_an_escalation_page_shows_the_situation_and_its_buttons(deck: Deck) -> None:
    esc = deck.tick_until_pending()
    page = get(deck.sign_in(), f"{deck.base}/escalations/{esc['id']}")
    assert page.status_code == 200
    shown = text(page.text)
    situation = esc["situation"]
    assert esc["summary"] in shown
    proposal = situation["proposals"][0]
    assert proposal["reason"] in shown and proposal["proposer"] in shown
    assert f"Approving runs {proposal['action']}" in shown
    for fact in situation["facts"][:3]:
        assert f"kind ={fact['kind']}" in shown  # text() parts <b>kind</b>=value
    assert f"will {esc['default_action']['action']}" in shown
    assert 'id="approve"' in page.text and 'id="deny"' in page.text


def test_answer_forms_need_the_csrf_value_and_this_origin(deck: Deck) -> None:
    esc = deck.tick_until_pending()
    base, esc_id = deck.base, esc["id"]
    s = deck.sign_in()
    page = get(s, f"{base}/escalations/{esc_id}").text
    csrf = answer_csrf(page)
    url = f"{base}/escalations/{esc_id}/answer"

    def post(session: requests.Session | Any, data: dict[str, str],
             headers: dict[str, str] | None = None) -> requests.Response:  # fmt: skip
        return session.post(url, data=data, headers={"Origin": base} if headers is None
                            else headers, allow_redirects=False, timeout=10)  # fmt: skip

    assert post(s, {"decision": "approve"}).status_code == 403  # no CSRF value
    assert post(s, {"decision": "approve", "csrf": "0" * 64}).status_code == 403
    assert post(s, {"decision": "approve", "csrf": csrf},
                {"Origin": "http://evil.example"}).status_code == 403  # fmt: skip
    assert post(s, {"decision": "approve", "csrf": csrf},
                {"Referer": "http://evil.example/x"}).status_code == 403  # fmt: skip
    assert post(s, {"decision": "approve", "csrf": csrf}, {}).status_code == 403  # neither
    assert post(requests, {"decision": "approve", "csrf": csrf}).status_code == 401  # no session
    other = deck.sign_in()  # another session: this page's value is not its own
    assert post(other, {"decision": "approve", "csrf": csrf}).status_code == 403
    elsewhere = csrf_of(get(s, f"{base}/").text)  # the sign-out form's value
    assert post(s, {"decision": "approve", "csrf": elsewhere}).status_code == 403
    json_body = s.post(url, json={"decision": "approve", "csrf": csrf},
                       headers={"Origin": base}, allow_redirects=False, timeout=10)  # fmt: skip
    assert json_body.status_code == 415
    row = deck.app.journal.escalations.escalation(esc_id)
    assert row is not None and row["status"] == "pending" and row["answered_by"] is None


def test_approve_through_the_form_is_journaled_and_the_next_tick_runs_it(deck: Deck) -> None:
    esc = deck.tick_until_pending()
    base, esc_id = deck.base, esc["id"]
    s = deck.sign_in()
    csrf = answer_csrf(get(s, f"{base}/escalations/{esc_id}").text)
    r = s.post(f"{base}/escalations/{esc_id}/answer", data={"decision": "approve", "csrf": csrf},
               headers={"Origin": base}, allow_redirects=False, timeout=10)  # fmt: skip
    assert r.status_code == 303 and r.headers["location"].startswith(f"/escalations/{esc_id}")
    j = deck.app.journal
    row = j.escalations.escalation(esc_id)
    assert row is not None and row["status"] == "approved" and row["answered_by"] == "operator"
    shown = esc["situation"]["proposals"][0]
    assert row["answer"]["action"] == shown["action"]
    again = s.post(f"{base}/escalations/{esc_id}/answer", data={"decision": "deny", "csrf": csrf},
                   headers={"Origin": base}, allow_redirects=False, timeout=10)  # fmt: skip
    assert again.status_code == 409 and "not pending" in text(again.text)
    deck.app.controller.tick()
    row = j.escalations.escalation(esc_id)
    assert row is not None and row["status"] == "executed", row["status"]
    [act] = [a for a in j.actions.actions_for_escalation(esc_id) if a["parent_id"] is None]
    # the approved proposal, as a person's, through the guards (a scale_to up is a launch)
    assert act["verdict"] == "act" and act["proposer"] == "human:operator"
    assert act["status"] in ("ok", "intent") and f"#{esc_id}" in act["reason"]
    after = text(get(s, f"{base}/escalations/{esc_id}").text)
    assert "executed" in after and "answered by operator" in after
    assert f"{act['id']} {act['action']}" in after


def test_deny_through_the_form(deck: Deck) -> None:
    esc = deck.tick_until_pending()
    s = deck.sign_in()
    url = f"{deck.base}/escalations/{esc['id']}"
    csrf = answer_csrf(get(s, url).text)
    r = s.post(f"{url}/answer", data={"decision": "deny", "csrf": csrf},
               headers={"Referer": url}, allow_redirects=False, timeout=10)  # fmt: skip
    assert r.status_code == 303
    row = deck.app.journal.escalations.escalation(esc["id"])
    assert row is not None and row["status"] == "denied"
    deck.app.controller.tick()
    assert not deck.app.journal.actions.actions_for_escalation(esc["id"])


@pytest.mark.parametrize(
    ("status", "by", "answer", "shown"),
    [
        (
            "resolved",
            "controller",
            {"note": "the situation no longer holds"},
            "Closed: the situation no longer holds",
        ),
        (
            "approved",
            "llm:model",
            {
                "action": "hold",
                "params": {"reason": "wait"},
                "proposer": "llm:model",
                "confidence": 0.9,
            },
            "Answer: hold reason =wait",  # the page marks up each key
        ),
        ("denied", "operator", None, "answered by operator"),
        ("expired", "deadline", None, "answered by deadline"),
    ],
)
def test_an_answered_escalation_page_shows_its_answer_whatever_its_shape(
    deck: Deck, status: str, by: str, answer: dict[str, Any] | None, shown: str
) -> None:
    """Each way an escalation ends, as the journal holds it (the router's note, the LLM's
    proposal, a denial, a deadline): the page opens and says it."""
    esc = deck.tick_until_pending()
    assert deck.app.journal.escalations.answer(
        esc["id"], status=status, by=by, now=deck.app.controller.clock(), answer=answer
    )
    s = deck.sign_in()
    r = get(s, f"{deck.base}/escalations/{esc['id']}")
    assert r.status_code == 200, text(r.text)
    assert shown in text(r.text), text(r.text)


def test_a_public_https_url_makes_the_cookie_secure_and_is_an_allowed_origin(
    tmp_path: Path,
) -> None:
    journal = Journal(tmp_path / "j.db")
    app = create_app(journal, SecretStr(TOKEN), clock=lambda: 500.0,
                     view=View(public_url="https://fleet.example.org"))  # fmt: skip
    with served(app, journal) as base:
        r = requests.post(f"{base}/login", data={"token": TOKEN, "next": "/"},
                          headers={"Origin": "https://fleet.example.org"},
                          allow_redirects=False, timeout=10)  # fmt: skip
        assert r.status_code == 303
        assert "secure" in [p.strip().lower() for p in r.headers["set-cookie"].split(";")]
        away = requests.post(f"{base}/login", data={"token": TOKEN, "next": "/"},
                             headers={"Origin": "https://fleet.example.org.evil.example"},
                             allow_redirects=False, timeout=10)  # fmt: skip
        assert away.status_code == 403 and "set-cookie" not in away.headers


def test_browsers_get_html_and_api_clients_json() -> None:
    assert wants_html(HTML["Accept"]) and wants_html("text/html")
    assert not wants_html("*/*") and not wants_html("") and not wants_html("application/json")
    assert not wants_html("application/json, text/html;q=0.5")
