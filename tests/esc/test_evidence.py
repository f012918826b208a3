"""A proposal put to a person or the LLM (an approval, a low confidence, a conflict) carries
the facts it matched: the message's evidence and the prompt show the instance, and the
actions its status allows are offered."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from controller.service.assemble import assemble
from controller.service.config import parse_config
from escalation.llm_request import render_prompt
from escalation.render import Renderer
from escalation.situation import from_dict


def _first(path: Path, kind: str) -> dict[str, Any] | None:
    if not path.exists():
        return None
    for line in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if record["kind"] == kind:
            return record
    return None


def test_an_approval_shows_the_instance_it_is_about(tmp_path: Path) -> None:
    cfg = parse_config("t.yaml", "gate:\n  actions: {restart_daemon: propose}\n")
    app = assemble(cfg, state=tmp_path, clock=time.time, sleep=time.sleep, seed=7)
    try:
        for _ in range(300):
            app.controller.tick()
            record = _first(tmp_path / "escalations.jsonl", "approval")
            if record is not None:
                break
        assert record is not None, "no approval asked in 300 ticks"
        esc = app.journal.escalations.escalation(int(record["id"]))
        assert esc is not None
    finally:
        app.close()
    ident = record["subject"].split(":")[1]
    evidence = record["message"].split("Evidence:\n")[1].split("\n\n")[0]
    assert f"id={ident} " in evidence and "daemon=down" in evidence, evidence
    assert "(no facts attached)" not in record["message"]
    situation = from_dict(esc["situation"])
    # its host is known, so a person may block it; it runs, so it may be rebooted or drained
    assert {"block_host", "reboot", "drain"} <= set(situation.allowed_actions)
    prompt = render_prompt(Renderer(), situation)[1]["content"]
    facts = prompt.split("facts:\n")[1].split("proposals the rules made:")[0]
    assert f'"id": "{ident}"' in facts and '"daemon": "down"' in facts, facts
