"""Act: carry out decisions against the provider, journaling intent before and result after.

Every launch gets a unique label (its idempotency key) and its own journal row written before
the provider is called; a failed create is never retried here (the next tick decides again,
and a create that did succeed shows up in the listing under its label).
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass, field, replace
from typing import Any

from controller.core.actions import descriptor
from controller.core.brief import brief
from controller.core.model import Decision
from controller.core.policy import Guards
from controller.core.track import History
from controller.fleet.base import (
    Actuated,
    CreateOutcomeUnknown,
    LaunchRequest,
    NotDone,
    ProviderError,
    TemporaryProviderError,
)
from controller.store.journal import Journal

log = logging.getLogger(__name__)


@dataclass
class Outcome:
    status: str  # ok, failed, partial
    result: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Job:
    """One `act` decision and what carrying it out needs to know."""

    decision: Decision
    action_id: int  # its intent row
    tick_id: int
    hist: History
    now: float
    facts: dict[str, dict[str, Any]]

    @property
    def params(self) -> dict[str, Any]:
        return self.decision.effective_params


class Actuator:
    def __init__(self, provider: Actuated, journal: Journal, limits: Guards) -> None:
        self.provider = provider
        self.journal = journal
        self.limits = limits

    def execute(self, job: Job) -> Outcome:
        """Run the job's decision; journal its result under its intent row and return it."""
        d = job.decision
        try:
            outcome = self._run(job)
        except ProviderError as exc:
            temporary = isinstance(exc, TemporaryProviderError)
            outcome = Outcome("failed", {"error": str(exc), "temporary": temporary})
        self.journal.actions.finish(job.action_id, job.now, outcome.status, outcome.result)
        level = logging.DEBUG if outcome.status == "ok" else logging.WARNING
        log.log(
            level,
            "action #%d %s %s by %s: %s %s",
            job.action_id,
            d.effective_action,
            brief(job.params),
            d.proposal.proposer,
            outcome.status,
            brief(outcome.result),
        )
        return outcome

    def _run(self, job: Job) -> Outcome:
        """Dispatch on the action's executor (its descriptor in controller.core.actions)."""
        action, params = job.decision.effective_action, job.params
        executor = descriptor(action).executor
        if executor == "launch":
            return self._launches(job, int(params["count"]))
        if executor == "replace":
            return self._replace(job)
        if executor == "block_host":
            until = job.now + float(params["for"])  # validated: a day unless it says
            self.journal.fleet.block_host(
                str(params["machine"]), until, str(params.get("reason", ""))
            )
            return Outcome("ok", {"blocked_until": until})
        if executor == "provider_call":
            call = getattr(self.provider, action, None)
            if call is None:  # stop/start: only a fleet that parks (`base.Parks`) has them
                return Outcome("failed", {"error": f"this fleet's provider cannot {action}"})
            try:
                call(str(params["instance"]))
            except TemporaryProviderError as exc:
                if action not in ("stop", "start") or isinstance(exc, NotDone):
                    raise  # NotDone: refused before acting (429) or never sent
                # vast may have done it: journaled as done until the listing says otherwise.
                # A stop: parked while it shows stopped (one that runs on leaves the pool,
                # `track._parked`), not a stopped instance fleetgate did not stop (asked
                # about, replaced); a start: asked, so one left waiting for its host is
                # destroyed by the warm pool's rules, not kept parked and billing for good
                return Outcome("unknown", {"error": str(exc), "temporary": True})
            return Outcome("ok", {})
        if executor == "notify":
            log.warning("notify: %s", params.get("message"))
            return Outcome("ok", {})
        if executor == "record":
            return Outcome("ok", {})  # recorded in the journal, nothing to call
        log.error("action #%d: %s is never carried out here", job.action_id, action)
        return Outcome("failed", {"error": f"{action!r} is not an action the actuator carries out"})

    def _launches(self, job: Job, count: int) -> Outcome:
        launched: list[str] = []
        errors: list[str] = []
        unknown: list[str] = []
        for n in range(count):
            ok, detail = self._launch_one(job, launch_label(job.tick_id, job.action_id, n))
            {True: launched, False: errors, None: unknown}[ok].append(detail)
            if not ok:
                break  # a market that refused (or did not answer) once will likely do it again
        status = "ok" if not errors and not unknown else ("partial" if launched else "failed")
        if unknown and not launched and not errors:
            status = "unknown"
        return Outcome(status, {"launched": launched, "errors": errors, "unknown": unknown})

    def _launch_one(self, job: Job, label: str) -> tuple[bool | None, str]:
        """(True, id) rented; (False, why) refused; (None, why) unknown: looked for later."""
        p = job.decision.proposal
        child = self.journal.actions.record(
            tick_id=job.tick_id, now=job.now, action="launch", target="fleet",
            params={"label": label}, proposer=p.proposer, reason=p.reason,
            confidence=p.confidence, verdict="act", why=f"part of action #{job.action_id}",
            status="intent", key=label, parent_id=job.action_id, escalation_id=p.escalation_id,
        )  # fmt: skip
        request = LaunchRequest(
            label=label,
            exclude_machines=frozenset(m for m, t in job.hist.host_blocks.items() if t > job.now),
            prefer_rates=tuple(sorted(job.hist.launch_rates().items())),
            max_dph=self.limits.launch_dph_estimate,
        )
        try:
            instance_id = self.provider.launch(request)
        except CreateOutcomeUnknown as exc:
            # it may be renting right now: never create again, find it by its label later
            self.journal.actions.finish(
                child, job.now, "unknown", {"error": str(exc), "label": label}
            )
            return None, f"{label}: outcome unknown"
        except ProviderError as exc:
            self.journal.actions.finish(child, job.now, "failed", {"error": str(exc)})
            return False, f"{label}: {exc}"
        self.journal.actions.finish(child, job.now, "ok", {"instance": instance_id, "label": label})
        return True, instance_id

    def _replace(self, job: Job) -> Outcome:
        """Launch the replacement now; the loop destroys the old one (see `loop.followups`)."""
        old = str(job.params["instance"])
        result: dict[str, Any] = {}
        machine = job.facts.get(old, {}).get("machine_id")
        if job.params.get("block_host") and machine:
            p = job.decision.proposal
            reason = job.params.get("reason") or p.reason
            until = job.now + job.hist.block_s(str(machine))
            self.journal.fleet.block_host(str(machine), until, f"{p.proposer}: {reason}")
            job = replace(
                job, hist=replace(job.hist, host_blocks={**job.hist.host_blocks, machine: until})
            )
            result["blocked_host"] = machine
        label = launch_label(job.tick_id, job.action_id, 0)
        # recorded before the create: a process that dies while it rents leaves the old
        # instance retiring, waiting for this label (not replaced again by another rental)
        deadline = job.now + self.limits.replace_deadline_s
        self.journal.actions.add_replacement(old, label, job.now, deadline, job.action_id)
        ok, detail = self._launch_one(job, label)
        if ok is False:
            self.journal.actions.set_replacement(old, "failed")  # rented nothing
            return Outcome("failed", {**result, "error": detail})
        return Outcome("ok", {**result, "replacement": detail, "label": label})


def launch_label(tick_id: int, action_id: int, n: int) -> str:
    """Unique per launch: the tick, the action row, the ordinal and a random suffix."""
    return f"fg-{tick_id}-{action_id}-{n}-{secrets.token_hex(3)}"
