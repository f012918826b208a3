"""Every printed way to answer works as pasted: the real message's curl lines run by bash
against a running API on loopback, and its links open a GET page."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from pydantic import SecretStr
from support import served

from controller.service.api import create_app
from controller.store.journal import Journal
from escalation import approvals
from escalation.notify import Notifier
from escalation.render import Renderer
from escalation.router import Escalator, overridable_cap
from escalation.situation import from_dict

TOKEN = "printed-answer-token"


HOLD = {"action": "hold", "params": {}}


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[str, Journal]]:
    journal = Journal(tmp_path / "j.db")
    with served(create_app(journal, SecretStr(TOKEN), clock=lambda: 500.0), journal) as base:
        yield base, journal


# far ahead: a pasted CLI line answers on the simulator's clock (its virtual 2025), and an
# escalation past its deadline takes no answer
DEADLINE = 4_000_000_000.0


def raise_one(j: Journal, proposed: bool = True) -> int:
    situation = {
        "kind": "unmatched",
        "subject": "instance:7",
        "summary": "frozen",
        "facts": [{"id": "7", "machine_id": "m-1"}],
        "key": {},
        "proposals": [
            {
                "action": "reboot",
                "params": {"instance": "7"},
                "proposer": "rule:r",
                "confidence": 0.5,
                "reason": "frozen",
            }
        ],
        "recent_actions": [],
        "fleet": {},
        "budget": {},
        "allowed_actions": ["hold", "reboot", "destroy"],
        "default_action": {"action": "hold", "params": {}},
        "created_at": 100.0,
    }
    if not proposed:
        situation["proposals"] = []
    return j.escalations.add_escalation(fingerprint="fp", kind="unmatched", subject="instance:7",
                                        summary="frozen", now=100.0, deadline=DEADLINE,
                                        situation=situation,
                                        default_action=HOLD)  # fmt: skip


def message(e: Escalator, j: Journal, esc: int, template: str) -> str:
    s = from_dict(j.escalations.escalation(esc)["situation"])
    d: dict[str, Any] = e._esc_dict(esc, {**s.__dict__, "facts": list(s.facts),
                                          "proposals": list(s.proposals),
                                          "recent_actions": [], "allowed_actions":
                                          list(s.allowed_actions)}, "fp", 100.0)  # fmt: skip
    return Renderer().render(template, esc=d, how=e.how(esc, override=overridable_cap(s)))


def curl_lines(text: str) -> list[str]:
    text = text.replace('\\"', '"').replace("\\\\", "\\")  # JSON templates quote the lines
    return re.findall(r"curl -sS [^\n|]*?/answer", text)


# ntfy's short message carries no curl line: its buttons answer, its link opens the page
@pytest.mark.parametrize("template", ["message.txt.j2", "slack.json.j2", "email.txt.j2",
                                      "pagerduty.json.j2", "webhook.json.j2",
                                      "alertmanager.json.j2"])  # fmt: skip
def test_the_printed_curl_lines_work_as_pasted(api: tuple[str, Journal], template: str) -> None:
    base, j = api
    esc = raise_one(j)
    e = Escalator(j, Notifier([], Renderer()), window_s=60, deadline_s=1900, answer_url=base)
    text = message(e, j, esc, template)
    lines = curl_lines(text)
    approve = [line for line in lines if "approve" in line]
    assert approve, f"{template} prints no approve curl line"
    env = {**os.environ, "FLEETGATE_API_TOKEN": TOKEN}
    run = subprocess.run(["bash", "-c", approve[0]], env=env, capture_output=True, text=True,
                         timeout=30)  # fmt: skip
    assert run.returncode == 0 and '"approved"' in run.stdout, run.stdout + run.stderr
    [p] = approvals.approved_proposals(j)  # what the next tick's apply receives
    assert (p.action, p.params["instance"], p.proposer) == ("reboot", "7", "human:operator")


@pytest.mark.parametrize(
    "template,where",
    [
        ("pagerduty.json.j2", "href"),
        ("alertmanager.json.j2", "generatorURL"),
        ("ntfy.json.j2", "click"),
    ],
)
def test_the_links_open_a_get_page(api: tuple[str, Journal], template: str, where: str) -> None:
    import json

    base, j = api
    esc = raise_one(j)
    e = Escalator(j, Notifier([], Renderer()), window_s=60, deadline_s=1900, answer_url=base)
    doc = json.loads(message(e, j, esc, template))
    url = doc["links"][0]["href"] if where == "href" else doc[where]
    page = requests.get(url, timeout=10)
    assert page.status_code == 200
    assert page.json()["status"] == "pending" and "escalations approve" in page.json()["answer"]


@pytest.mark.parametrize("status", ["denied", "expired", "resolved"])
def test_a_link_to_a_closed_escalation_says_it_takes_no_answer(
    api: tuple[str, Journal], status: str
) -> None:
    """PagerDuty's link or Alertmanager's generatorURL opened after the escalation was
    answered, expired or resolved: the page says it takes no answer (it told how to approve
    or deny it, each refused as not pending), to an API client and to a browser."""
    base, j = api
    esc = raise_one(j)
    assert j.escalations.answer(esc, status=status, by="x", now=200.0, answer=None)
    doc = requests.get(f"{base}/escalations/{esc}", timeout=10).json()
    assert doc["status"] == status and doc["answer"] == f"escalation #{esc} is {status}: " \
        "it takes no answer"  # fmt: skip
    page = requests.get(f"{base}/escalations/{esc}", headers={"Accept": "text/html"}, timeout=10)
    assert "It takes no answer now" in page.text and "and answer it" not in page.text


def test_the_webhooks_approve_line_names_an_action_as_the_message_does(tmp_path: Path) -> None:
    """Without a proposal a bare approve is refused ("has no proposed action"): the webhook's
    `how.approve_cli`, which a receiver shows as the command, names `--action NAME` as its
    `message` and every other channel do (it was the bare approve)."""
    import json

    j = Journal(tmp_path / "j.db")
    try:
        esc = raise_one(j, proposed=False)
        e = Escalator(j, Notifier([], Renderer()), window_s=60, deadline_s=1900)
        s = from_dict(j.escalations.escalation(esc)["situation"])
        d: dict[str, Any] = e._esc_dict(esc, {**s.__dict__, "facts": list(s.facts),
                                              "proposals": [], "recent_actions": [],
                                              "allowed_actions": list(s.allowed_actions)},
                                        "fp", 100.0)  # fmt: skip
        body = json.loads(Renderer().render("webhook.json.j2", esc=d,
                                            how=e.how(esc, proposed=False)))  # fmt: skip
        assert body["how"]["approve_cli"] == f"fleetgate escalations approve {esc} --action NAME"
        assert f"Approve:  {body['how']['approve_cli']}\n" in body["message"]
    finally:
        j.close()


def cli_line(text: str, verb: str) -> str:
    """The `fleetgate ... escalations <verb> N` line as the message prints it."""
    [line] = re.findall(rf"^(?:Approve|Deny): +(fleetgate .*escalations {verb} \d+.*)$", text,
                        re.MULTILINE)  # fmt: skip
    return line


@dataclass
class OnDisk:
    """A journal in a state directory whose name needs quoting, and the escalator whose
    printed commands name it, as `fleetgate run` builds them."""

    state: Path
    journal: Journal
    escalator: Escalator

    def paste(self, line: str) -> subprocess.CompletedProcess[str]:
        """`line` run by bash in a directory of its own, with `fleetgate` found on PATH as
        an installed command is."""
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
        return subprocess.run(["bash", "-c", line], env=env, cwd=self.state.parent,
                              capture_output=True, text=True, timeout=60)  # fmt: skip

    def veto(self, situation: dict[str, Any]) -> int:
        """A guard_veto escalation of `situation`."""
        return self.journal.escalations.add_escalation(
            fingerprint="fp", kind="guard_veto", subject=situation["subject"],
            summary=situation["summary"], now=100.0, deadline=DEADLINE, situation=situation,
            default_action=HOLD)  # fmt: skip


@pytest.fixture
def on_disk(tmp_path: Path) -> Iterator[OnDisk]:
    from controller.service.assemble import cli_prefix

    state = tmp_path / "some state"  # a space, so the printed line must quote it
    state.mkdir()
    j = Journal(state / "journal.db")
    try:
        yield OnDisk(
            state,
            j,
            Escalator(
                j,
                Notifier([], Renderer()),
                window_s=60,
                deadline_s=1900,
                cli_prefix=cli_prefix(None, state),
            ),
        )
    finally:
        j.close()


@pytest.mark.parametrize("template", ["message.txt.j2", "email.txt.j2"])
def test_the_printed_fleetgate_lines_work_as_pasted(on_disk: OnDisk, template: str) -> None:
    """The approve and deny commands a message prints, run by bash in a directory of their
    own, with `fleetgate` found on PATH as an installed command is."""
    e, j = on_disk.escalator, on_disk.journal
    first, second = raise_one(j), raise_one(j)
    approve = cli_line(message(e, j, first, template), "approve")
    assert approve.endswith(f"approve {first}")  # proposal 1 without --action
    run = on_disk.paste(approve)
    assert run.returncode == 0, run.stdout + run.stderr
    [p] = approvals.approved_proposals(j)  # what the next tick's apply receives
    assert (p.action, p.params["instance"]) == ("reboot", "7")
    assert p.proposer.startswith("human:")  # the person at the shell: the login's name
    run = on_disk.paste(cli_line(message(e, j, second, template), "deny"))
    assert run.returncode == 0, run.stdout + run.stderr
    assert j.escalations.escalation(second)["status"] == "denied"
    assert len(approvals.approved_proposals(j)) == 1


def test_without_a_proposal_no_approve_by_http_is_printed(tmp_path: Path) -> None:
    """`{"decision": "approve"}` without an action on an escalation with no proposal is a
    422: the message printed it all the same."""
    j = Journal(tmp_path / "j.db")
    try:
        e = Escalator(j, Notifier([], Renderer()), window_s=60, deadline_s=1900,
                      answer_url="http://127.0.0.1:8765")  # fmt: skip
        assert "approve_http" in e.how(3) and "deny_http" in e.how(3)
        bare = e.how(3, proposed=False)
        assert "approve_http" not in bare and "deny_http" in bare
    finally:
        j.close()


def test_a_capped_proposal_prints_the_override_that_carries_it_out(on_disk: OnDisk) -> None:
    """A replacement `max_instances` refused: a bare approve is vetoed again by the same cap,
    so the message prints the approve with `--override max_instances`, and it works as
    pasted (the answer carries the override to the guards, journaled)."""
    proposal = {"action": "replace", "params": {"instance": "7", "reason": "crash loop"},
                "proposer": "rule:replace-crash-looping-instance", "confidence": 0.9,
                "reason": "crash loop"}  # fmt: skip
    esc = on_disk.veto({
        "kind": "guard_veto", "subject": "fleet",
        "summary": "rule:replace-crash-looping-instance wants to replace instance 7, "
                   "which needs room for 1 more instance(s), but max_instances allows none",
        "facts": [], "key": {"guard": "max_instances"}, "proposals": [proposal],
        "recent_actions": [], "fleet": {}, "budget": {},
        "allowed_actions": ["hold", "launch", "replace", "scale_to"],
        "default_action": HOLD, "created_at": 100.0,
    })  # fmt: skip
    text = message(on_disk.escalator, on_disk.journal, esc, "message.txt.j2")
    [line] = [x.split(":", 1)[1].strip() for x in text.splitlines()
              if x.strip().startswith("past max_instances:")]  # fmt: skip
    assert line.endswith(f"approve {esc} --override max_instances")
    run = on_disk.paste(line)
    assert run.returncode == 0, run.stdout + run.stderr
    [p] = approvals.approved_proposals(on_disk.journal)
    assert (p.action, p.params["instance"], p.overrides) == (
        "replace", "7", ("max_instances",))  # fmt: skip


@pytest.mark.parametrize("guard", ["paused", "drain_before_destroy", "unknown_node",
                                   "daemon_never_answered", "cooldown"])  # fmt: skip
def test_a_guard_no_answer_may_exceed_prints_no_override(on_disk: OnDisk, guard: str) -> None:
    """An LLM's answer the pause (or the drain before a destroy, a cooldown, ...) refused is
    put to people as a guard_veto naming that guard: no `--override` gets past it, so the
    message prints none (it printed `approve N --override paused`, refused when pasted, and
    said a bare approve would be vetoed again); the Approve line it prints works as pasted."""
    proposal = {"action": "reboot", "params": {"instance": "7"}, "proposer": "llm:m",
                "confidence": 0.9, "reason": "frozen"}  # fmt: skip
    esc = on_disk.veto({
        "kind": "guard_veto", "subject": "instance:7",
        "summary": f"llm:m answered escalation #1 with reboot instance=7, but the guards "
                   f"refused it ({guard})",
        "facts": [{"kind": "instance", "id": "7", "status": "running"}],
        "key": {"guard": guard, "escalation": 1}, "proposals": [proposal],
        "recent_actions": [], "fleet": {}, "budget": {},
        "allowed_actions": ["hold", "notify", "reboot", "replace"],
        "default_action": HOLD, "created_at": 100.0,
    })  # fmt: skip
    text = message(on_disk.escalator, on_disk.journal, esc, "message.txt.j2")
    assert "--override" not in text and "vetoes the approved action again" not in text
    run = on_disk.paste(cli_line(text, "approve"))
    assert run.returncode == 0, run.stdout + run.stderr
    [p] = approvals.approved_proposals(on_disk.journal)
    assert (p.action, p.params["instance"], p.overrides) == ("reboot", "7", ())


def test_a_printed_line_works_from_another_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A controller started with relative paths (`--config etc/config.yaml --state state`,
    as the example's header shows them) prints them absolute: the line pasted from Slack
    into a shell in the home directory answers (before: `etc/config.yaml: cannot read`)."""
    from controller.service.assemble import cli_prefix

    where = tmp_path / "controller"
    (where / "etc").mkdir(parents=True)
    (where / "etc" / "config.yaml").write_text("interval_s: 60\n")
    (where / "state").mkdir()
    monkeypatch.chdir(where)
    j = Journal(where / "state" / "journal.db")
    try:
        e = Escalator(j, Notifier([], Renderer()), window_s=60, deadline_s=1900,
                      cli_prefix=cli_prefix("etc/config.yaml", Path("state")))  # fmt: skip
        esc = raise_one(j)
        approve = cli_line(message(e, j, esc, "message.txt.j2"), "approve")
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
        home = tmp_path / "home"
        home.mkdir()
        run = subprocess.run(["bash", "-c", approve], env=env, cwd=home, capture_output=True,
                             text=True, timeout=60)  # fmt: skip
        assert run.returncode == 0, approve + "\n" + run.stdout + run.stderr
        assert j.escalations.escalation(esc)["status"] == "approved"
    finally:
        j.close()


@pytest.mark.parametrize("source", ["env", "file"])
def test_the_curl_lines_read_the_token_where_the_config_reads_it(
    api: tuple[str, Journal], tmp_path: Path, source: str
) -> None:
    """`api.token: {env: OPS_TOKEN}` or `{file: ...}`: a line naming $FLEETGATE_API_TOKEN got a
    401 when pasted into the operator's shell, which holds the token where the config says."""
    from controller.service.config import parse_config
    from controller.service.secrets import in_shell

    base, j = api
    token_file = tmp_path / "api token"  # a space: the path is quoted for the shell
    token_file.write_text(TOKEN + "\n")
    ref = "{env: OPS_TOKEN}" if source == "env" else f"{{file: '{token_file}'}}"
    config = parse_config("c.yaml", f"api: {{token: {ref}}}\n", {"OPS_TOKEN": TOKEN})
    shell = in_shell(config.api.token, "$FLEETGATE_API_TOKEN") if config.api else ""
    assert TOKEN not in shell
    esc = raise_one(j)
    e = Escalator(j, Notifier([], Renderer()), window_s=60, deadline_s=1900, answer_url=base,
                  token_shell=shell)  # fmt: skip
    [approve] = [line for line in curl_lines(message(e, j, esc, "message.txt.j2"))
                 if "approve" in line]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "FLEETGATE_API_TOKEN"}
    if source == "env":
        env["OPS_TOKEN"] = TOKEN
    run = subprocess.run(["bash", "-c", approve], env=env, capture_output=True, text=True,
                         timeout=30)  # fmt: skip
    assert run.returncode == 0 and '"approved"' in run.stdout, approve + run.stdout + run.stderr


def test_a_links_page_names_the_commands_messages_print(api: tuple[str, Journal]) -> None:
    """The JSON page said `fleetgate escalations approve N`, without the controller's --config
    and --state, nor --action where nothing was proposed."""
    from controller.service.dashboard import public_doc

    _, j = api
    esc_id = raise_one(j, proposed=False)
    e = Escalator(j, Notifier([], Renderer()), window_s=60, deadline_s=1900,
                  cli_prefix="/opt/fleetgate/bin/fleetgate --config /etc/fleetgate/config.yaml",
                  answer_url="http://127.0.0.1:1", token_shell="${OPS_TOKEN}")  # fmt: skip
    answer = public_doc(j.escalations.escalation(esc_id), e.how)["answer"]
    assert (f"`/opt/fleetgate/bin/fleetgate --config /etc/fleetgate/config.yaml escalations "
            f"approve {esc_id} --action NAME`") in answer, answer  # fmt: skip
    assert '"Authorization: Bearer ${OPS_TOKEN}"' in answer and '"action": "NAME"' in answer
