"""Act: carry out decisions against the provider, journaling intent before and result after.

Every launch gets a unique label (its idempotency key) and its own journal row written before
the provider is called; a failed create is never retried here (the next tick decides again,
and a create that did succeed shows up in the listing under its label).
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass, field
from typing import Any

from controller.journal import Journal
from controller.model import Decision
from controller.providers.base import LaunchRequest, Provider, ProviderError
from controller.settings import Guards
from controller.track import History

log = logging.getLogger(__name__)


@dataclass
class Outcome:
    status: str  # ok, failed, partial
    result: dict[str, Any] = field(default_factory=dict)


class Actuator:
    def __init__(self, provider: Provider, journal: Journal, limits: Guards) -> None:
        self.provider = provider
        self.journal = journal
        self.limits = limits

    def execute(
        self,
        d: Decision,
        action_id: int,
        tick_id: int,
        hist: History,
        now: float,
        facts: dict[str, dict[str, Any]],
    ) -> Outcome:
        """Run one `act` decision whose intent row is `action_id`; journal and return its result."""
        action, params = d.effective_action, d.effective_params
        try:
            outcome = self._run(action, params, d, action_id, tick_id, hist, now, facts)
        except ProviderError as exc:
            outcome = Outcome("failed", {"error": str(exc), "temporary": _temporary(exc)})
        self.journal.finish(action_id, now, outcome.status, outcome.result)
        level = logging.DEBUG if outcome.status == "ok" else logging.WARNING
        log.log(
            level,
            "action #%d %s %s by %s: %s %s",
            action_id,
            action,
            _brief(params),
            d.proposal.proposer,
            outcome.status,
            _brief(outcome.result),
        )
        return outcome

    def _run(
        self,
        action: str,
        params: dict[str, Any],
        d: Decision,
        action_id: int,
        tick_id: int,
        hist: History,
        now: float,
        facts: dict[str, dict[str, Any]],
    ) -> Outcome:
        if action == "launch":
            return self._launches(int(params["count"]), d, action_id, tick_id, hist, now)
        if action == "replace":
            return self._replace(params, d, action_id, tick_id, hist, now, facts)
        if action == "block_host":
            until = now + float(params.get("for", 86_400))
            self.journal.block_host(str(params["machine"]), until, str(params.get("reason", "")))
            return Outcome("ok", {"blocked_until": until})
        if action in ("destroy", "reboot", "restart_daemon", "drain"):
            getattr(self.provider, action)(str(params["instance"]))
            return Outcome("ok", {})
        if action == "notify":
            log.warning("notify: %s", params.get("message"))
            return Outcome("ok", {})
        return Outcome("ok", {})  # hold and escalate are recorded, nothing to call

    def _launches(
        self, count: int, d: Decision, action_id: int, tick_id: int, hist: History, now: float
    ) -> Outcome:
        launched: list[str] = []
        errors: list[str] = []
        for n in range(count):
            label = launch_label(tick_id, action_id, n)
            ok, detail = self._launch_one(label, d, action_id, tick_id, hist, now)
            (launched if ok else errors).append(detail)
            if not ok:
                break  # an offer market that refused once will likely refuse again this tick
        status = "ok" if not errors else ("partial" if launched else "failed")
        return Outcome(status, {"launched": launched, "errors": errors})

    def _launch_one(
        self, label: str, d: Decision, parent: int, tick_id: int, hist: History, now: float
    ) -> tuple[bool, str]:
        child = self.journal.record(
            tick_id=tick_id, now=now, action="launch", target="fleet", params={"label": label},
            proposer=d.proposal.proposer, reason=d.proposal.reason,
            confidence=d.proposal.confidence,
            verdict="act", why=f"part of action #{parent}", status="intent", key=label,
            parent_id=parent, escalation_id=d.proposal.escalation_id,
        )  # fmt: skip
        request = LaunchRequest(
            label=label,
            exclude_machines=frozenset(m for m, t in hist.host_blocks.items() if t > now),
            prefer_rates=tuple(sorted(hist.host_rates.items())),
            max_dph=self.limits.launch_dph_estimate,
        )
        try:
            instance_id = self.provider.launch(request)
        except ProviderError as exc:
            self.journal.finish(child, now, "failed", {"error": str(exc)})
            return False, f"{label}: {exc}"
        self.journal.finish(child, now, "ok", {"instance": instance_id, "label": label})
        return True, instance_id

    def _replace(
        self,
        params: dict[str, Any],
        d: Decision,
        action_id: int,
        tick_id: int,
        hist: History,
        now: float,
        facts: dict[str, dict[str, Any]],
    ) -> Outcome:
        old = str(params["instance"])
        result: dict[str, Any] = {}
        machine = facts.get(old, {}).get("machine_id")
        if params.get("block_host") and machine:
            reason = params.get("reason") or d.proposal.reason
            self.journal.block_host(str(machine), now + 86_400, f"{d.proposal.proposer}: {reason}")
            hist = History(
                **{**hist.__dict__, "host_blocks": {**hist.host_blocks, machine: now + 86_400}}
            )
            result["blocked_host"] = machine
        label = launch_label(tick_id, action_id, 0)
        ok, detail = self._launch_one(label, d, action_id, tick_id, hist, now)
        if not ok:
            return Outcome("failed", {**result, "error": detail})
        self.journal.add_replacement(
            old, label, now, now + self.limits.replace_deadline_s, action_id
        )
        return Outcome("ok", {**result, "replacement": detail, "label": label})


def launch_label(tick_id: int, action_id: int, n: int) -> str:
    """Unique per launch: the tick, the action row, the ordinal and a random suffix."""
    return f"fg-{tick_id}-{action_id}-{n}-{secrets.token_hex(3)}"


def _temporary(exc: ProviderError) -> bool:
    from controller.providers.base import TemporaryProviderError

    return isinstance(exc, TemporaryProviderError)


def _brief(d: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in d.items())
