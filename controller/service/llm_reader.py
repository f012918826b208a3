"""The LLM reader of escalations, built from `escalation.llm` (an `LLMSettings`).

`require_check: true` keeps the reader off (people only) until `fleetgate llm-check` passed
for the configured model at the configured URL; the last check's result is in the journal.
Unset, it is on whenever the gate lets an answer act: an unchecked model never acts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from controller.store.journal import Journal
from escalation.llm import LLMClient, LLMSettings, UsageStore
from escalation.render import Renderer
from escalation.usage import JournalUsage

log = logging.getLogger(__name__)

CHECK_COMMAND = "fleetgate llm-check"  # as messages name it where the controller's is unknown
CHECK_KEY = "llm.check"  # the last `fleetgate llm-check`: base_url, model, ratio, at


def llm_client(
    settings: LLMSettings,
    journal: Journal,
    renderer: Renderer,
    *,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    usage: UsageStore | None = None,
) -> LLMClient:
    """The client; `usage` defaults to the journal's (the service's budget)."""
    budget = usage if usage is not None else JournalUsage(journal)
    return LLMClient(settings, renderer, budget, clock=clock, sleep=sleep)


def reader(
    settings: LLMSettings | None,
    journal: Journal,
    renderer: Renderer,
    *,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    enforce_check: bool = True,
    acting: bool = True,
    check: str = CHECK_COMMAND,
) -> LLMClient | None:
    """The LLM reader, or None (people only) when none is configured or its check is due;
    `acting`: the gate lets some answer act (what `require_check` defaults to); `check`: the
    command that checks it, as people paste it."""
    if settings is None:
        return None
    client = llm_client(settings, journal, renderer, clock=clock, sleep=sleep)
    required = acting if settings.require_check is None else settings.require_check
    if enforce_check and required and not check_passed(journal, settings):
        log.warning("LLM escalation is %s", off(settings, check))
        return None
    return client


def off(settings: LLMSettings, check: str = CHECK_COMMAND) -> str:
    """Why the reader is off (people only): its check (`check`, the command) is due. A check
    that passes later is taken when fleetgate starts again (each `fleetgate tick` does)."""
    return (f"off until `{check}` passes for model {settings.model!r} at "
            f"{settings.base_url} (read when fleetgate starts: restart `fleetgate run` after "
            "it passed)")  # fmt: skip


def unchecked(settings: LLMSettings, journal: Journal, check: str = CHECK_COMMAND
              ) -> Callable[[], str | None]:  # fmt: skip
    """Why an answer of the LLM may not act now, asked when the gate would let it act: then
    its check is required unless `require_check: false` (unset, it follows the gate in force,
    which SIGHUP may have changed since the reader was built), and must have passed for this
    model at this URL. None: it may act."""

    def why() -> str | None:
        if settings.require_check is False or check_passed(journal, settings):
            return None
        return (f"it acts only after `{check}` passed for model "
                f"{settings.model!r} at {settings.base_url}")  # fmt: skip

    return why


def check_passed(journal: Journal, settings: LLMSettings) -> bool:
    last = journal.meta.get(CHECK_KEY) or {}
    return bool(last.get("base_url") == settings.base_url and last.get("model") == settings.model
                and float(last.get("ratio", 0)) >= settings.check_threshold)  # fmt: skip


def record_check(journal: Journal, settings: LLMSettings, ratio: float, at: float) -> None:
    """Remember a `fleetgate llm-check` result for `require_check`."""
    journal.meta.put(
        CHECK_KEY,
        {"base_url": settings.base_url, "model": settings.model, "ratio": ratio, "at": at},
    )
