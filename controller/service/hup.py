"""SIGHUP in `fleetgate run`: the rules and the config are read again before the next tick.

The signal handler only sets a flag (`request`); the tick thread applies it (`apply`), so no
file is read and no journal row written inside a signal handler:

1. the rules: read again on this tick, changed or not (`RulesSource.force`; a bad edit keeps
   the last good rules, as always);
2. the config file, strictly. A file that does not load changes nothing: logged at ERROR and
   journaled. Otherwise what changed is compared key by key (top-level sections):
   - applied live: `settings` (what rules read as settings.NAME), `gate` (the autonomy gate),
     `retention`;
   - anything else (the provider, its sections, the guards, the channels, the LLM, the API,
     the journal, the lease, the interval) needs a restart: logged at WARNING and journaled,
     and the old values stay in force until then.

Each reload is journaled under the key `config.reload` (the last one): when, what was applied,
what needs a restart, or the error.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from controller.service.app import App
from controller.service.config import Config, ConfigError, load_config

log = logging.getLogger(__name__)

LIVE = ("settings", "gate", "retention")  # sections a running controller takes on at once
KEY = "config.reload"


class ConfigReload:
    """What `Runner(on_hup=...)` calls (`request`), and the tick runs first (`apply`)."""

    def __init__(self, app: App, config_path: str | None) -> None:
        self.app = app
        self.path = config_path
        self._asked = threading.Event()

    def request(self) -> None:
        self._asked.set()

    def apply(self) -> dict[str, Any] | None:
        """Steps 1 and 2 when a SIGHUP came since the last tick; the journaled record."""
        if not self._asked.is_set():
            return None
        self._asked.clear()
        self.app.controller.rules.force()
        now = self.app.controller.clock()
        if self.path is None:
            return self._record({"at": now, "applied": [], "restart_needed": [],
                                 "note": "no config file: the defaults stay"})  # fmt: skip
        try:
            new = load_config(self.path)
        except ConfigError as exc:
            log.error("SIGHUP: the config %s does not load; nothing changes: %s", self.path,
                      str(exc).splitlines()[0])  # fmt: skip
            return self._record({"at": now, "applied": [], "restart_needed": [],
                                 "error": str(exc)})  # fmt: skip
        changed = changed_sections(self.app.config, new)
        live = [k for k in changed if k in LIVE]
        later = [k for k in changed if k not in LIVE]
        if live:
            self._take(new, live)
            log.info("SIGHUP: config %s: applied %s", self.path, ", ".join(live))
        if later:
            log.warning("SIGHUP: config %s: %s changed; restart fleetgate to apply "
                        "(the old values stay in force)", self.path, ", ".join(later))  # fmt: skip
        if not changed:
            log.info("SIGHUP: config %s unchanged", self.path)
        return self._record({"at": now, "applied": live, "restart_needed": later})

    def _take(self, new: Config, keys: list[str]) -> None:
        from controller.core.policy import DecideSettings

        app = self.app
        app.config = app.config.model_copy(update={k: getattr(new, k) for k in keys})
        old = app.controller.settings
        values = {**DecideSettings().values, **app.config.settings}
        app.controller.settings = old.model_copy(update={"gate": app.config.gate,
                                                         "values": values})  # fmt: skip
        if "settings" in keys:  # the rules' conditions compare with the values they were read with
            app.controller.rules.use_settings(app.config.settings)

    def _record(self, doc: dict[str, Any]) -> dict[str, Any]:
        self.app.journal.meta.put(KEY, doc)
        return doc


def changed_sections(old: Config, new: Config) -> list[str]:
    """The top-level keys whose values differ (secrets compared by value, never shown)."""
    return [k for k in Config.model_fields if _plain(getattr(old, k)) != _plain(getattr(new, k))]


def _plain(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    return dump(mode="python") if dump is not None else value
