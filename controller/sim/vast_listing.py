"""The account's instances as vast's API lists, shows and changes them.

`Listing(world, now)` serves one call over the world's live instances and the account's
foreign ones: the paged `GET /api/v1/instances/` (`limit` at most 25, an opaque `after_token`
cursor from the previous page's `next_token`, `order_by` on id, `select_filters` terms; an
account without instances lists `"instances": null`, a reply vast's own client reads as none),
show, destroy, reboot and update. A create still hidden (SimConfig `late_create_s`) is neither
listed nor shown, though vast knows it (it can be destroyed).

Must not decide anything about the fleet; no I/O, no clock: `now` is given.
"""

from __future__ import annotations

import base64
import json
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from controller.fleet.base import PermanentProviderError
from controller.sim import vast_views as views
from controller.sim.account import ForeignInstance
from controller.sim.instance import SimInstance
from controller.sim.world import World

PAGE_MAX = 25  # vast's largest page
# vast's answer to a start that waits for its host's GPUs (rented meanwhile): HTTP 200
START_QUEUED = "Required resources are currently unavailable, state change queued."
Reply = tuple[int, Any]  # status and a JSON-able body (see vast_api)
Row = SimInstance | ForeignInstance
_TOKEN = "fgsim1:"  # inside the base64 of a cursor: opaque to clients


def error(code: str, msg: str) -> dict[str, Any]:
    """vast's error body."""
    return {"success": False, "error": code, "msg": msg}


@dataclass(frozen=True)
class ListQuery:
    """The query of one list call; values arrive JSON-encoded, except the cursor string."""

    limit: int
    after: int | None
    desc: bool
    filters: dict[str, dict[str, Any]]

    @classmethod
    def parse(cls, query: str) -> ListQuery:
        """ValueError (with a reason) on anything vast would refuse."""
        q = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
        limit = json.loads(q.get("limit", str(PAGE_MAX)))
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise ValueError(f"limit must be a positive integer (got {limit!r})")
        filters = json.loads(q.get("select_filters", "{}"))
        if not isinstance(filters, dict):
            raise ValueError("select_filters must be an object of {field: {op: value}}")
        desc = _descending(json.loads(q.get("order_by", "[]")))
        token = q.get("after_token")
        after = decode_token(token) if token else None
        return cls(min(limit, PAGE_MAX), after, desc, views.terms(filters))


def _descending(order: Any) -> bool:
    if order == []:
        return False
    if not isinstance(order, list) or len(order) != 1 or not isinstance(order[0], dict):
        raise ValueError(f"order_by must be [{{'col': 'id', 'dir': ...}}] (got {order!r})")
    col, direction = order[0].get("col"), order[0].get("dir", "asc")
    if col != "id" or direction not in ("asc", "desc"):
        raise ValueError(f"order_by: only col 'id', dir asc or desc (got {order!r})")
    return bool(direction == "desc")


def encode_token(last_id: int) -> str:
    return base64.urlsafe_b64encode(f"{_TOKEN}{last_id}".encode()).decode()


def decode_token(token: str) -> int:
    text = base64.urlsafe_b64decode(token.encode()).decode("ascii", "replace")
    if not text.startswith(_TOKEN) or not text[len(_TOKEN) :].isdigit():
        raise ValueError("after_token is not a cursor of this listing")
    return int(text[len(_TOKEN) :])


def _key(item: Row | dict[str, Any]) -> int:
    return item["id"] if isinstance(item, dict) else int(item.id)


class Listing:
    """One API call's view of the account's instances at `now`."""

    def __init__(self, world: World, now: float) -> None:
        self._world = world
        self._now = now

    def rows(self) -> list[Row]:
        """Every listed instance by id: foreign ones (ids below the world's), then the world's."""
        account = self._world.account
        foreign: list[Row] = sorted(account.foreign.values(), key=_key)
        live: list[Row] = [*self._world.live_instances()]
        if account.hidden_until:
            live = [i for i in live if not account.hidden(i.id, self._now)]
        return foreign + live if foreign else live

    def page(self, q: ListQuery) -> dict[str, Any]:
        """One page of the list reply."""
        rows = self.rows()
        items: list[Any] = rows
        if q.filters:
            items = [v for v in map(self.view, rows) if views.matches(v, q.filters)]
        if q.desc:
            end = len(items) if q.after is None else bisect_left(items, q.after, key=_key)
            start = max(0, end - q.limit)
            chunk, more = items[start:end][::-1], start > 0
        else:
            start = 0 if q.after is None else bisect_right(items, q.after, key=_key)
            chunk, more = items[start : start + q.limit], start + q.limit < len(items)
        shown = [self.view(item) for item in chunk]
        return {
            "success": True, "instances_found": len(shown), "total_instances": len(items),
            "next_token": encode_token(shown[-1]["id"]) if more and shown else None,
            "instances": shown if rows else None,  # an account without instances: null
        }  # fmt: skip

    def view(self, row: Row | dict[str, Any]) -> dict[str, Any]:
        if isinstance(row, dict):
            return row
        world = self._world
        machine = world.machines[row.machine_id]
        if isinstance(row, ForeignInstance):
            return views.foreign(row, machine)
        label = world.account.api_label(row.id, row.label, world.config.empty_label_fraction)
        return views.instance(row, machine, label, world.config.disk_gb)

    def find(self, instance_id: str) -> Row | None:
        """The instance vast knows by this id (hidden creates included), or None."""
        foreign = self._world.account.foreign.get(instance_id)
        if foreign is not None:
            return foreign
        try:
            return self._world.get(instance_id)
        except PermanentProviderError:
            return None

    def exists(self, instance_id: str) -> bool:
        return self.find(instance_id) is not None

    def show(self, instance_id: str) -> dict[str, Any] | None:
        row = self.find(instance_id)
        if row is None or self._world.account.hidden(instance_id, self._now):
            return None
        return self.view(row)

    def destroy(self, instance_id: str) -> Reply:
        if instance_id in self._world.account.foreign:
            self._world.account.destroy_foreign(instance_id)
        else:
            self._world.destroy(instance_id, self._now)
        return 200, {"success": True}

    def reboot(self, instance_id: str) -> Reply:
        if instance_id not in self._world.account.foreign:  # a foreign one: nothing to see
            self._world.reboot(instance_id, self._now)
        return 200, {"success": True}

    def update(self, instance_id: str, body: Any) -> Reply:
        """`{"state": "running"|"stopped"}` or `{"label": text}`. A start left waiting for the
        host's GPUs ("scheduling") is answered as vast does: success false, `START_QUEUED`."""
        body = body if isinstance(body, dict) else {}
        state, label = body.get("state"), body.get("label")
        foreign = self._world.account.foreign.get(instance_id)
        if state in ("running", "stopped"):
            if foreign is not None:
                foreign.status = state
            else:
                self._world.set_state(instance_id, state, self._now)
                waiting = self._world.get(instance_id).start_at is not None
                if state == "running" and waiting:
                    return 200, {"success": False, "msg": START_QUEUED}
        elif isinstance(label, str):
            if foreign is not None:
                foreign.label = label
            else:
                self._world.account.api_labels[instance_id] = label
        else:
            return 400, error("invalid_args", "expected state running/stopped or a label")
        return 200, {"success": True}
