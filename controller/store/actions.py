"""Intents and actions: every decision, written before acting and closed with its result; the
launches it made; the replacements still waiting for their new instance.

Tables: `actions`, `replacements`. An action to execute is checked against the leader lease
(`controller/store/lease.py`) in the transaction that writes it, so this part reads `leases`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from controller.store import totals
from controller.store.aggregate import Aggregate, dumps, loads
from controller.store.backend import Row, StaleLeader, Store, Tx

UNDECIDED = ("intent", "unknown")  # statuses that move on to an outcome, counted once it has
INTERRUPTED_NOTE = ("the controller stopped before the result was recorded; "
                    "the rules decide again from what is sensed now")  # fmt: skip


class Fence:
    """The lease an acting controller holds: every action it records must still match it."""

    def __init__(self, name: str, holder: str, token: int) -> None:
        self.name, self.holder, self.token = name, holder, token


def _decoded(rows: list[Row]) -> list[Row]:
    for r in rows:
        r["params"] = loads(r["params"], {})
        r["result"] = loads(r["result"])
    return rows


class Actions(Aggregate):
    """What the controller decided and did, who proposed it and why, and what came of it."""

    SCHEMA = """
CREATE TABLE IF NOT EXISTS actions (
  id INTEGER PRIMARY KEY, tick_id INTEGER, at REAL NOT NULL, action TEXT NOT NULL,
  target TEXT NOT NULL, params TEXT NOT NULL, proposer TEXT NOT NULL, reason TEXT NOT NULL,
  confidence REAL, verdict TEXT NOT NULL, why TEXT NOT NULL, guard TEXT, status TEXT NOT NULL,
  result TEXT, finished_at REAL, key TEXT UNIQUE, escalation_id INTEGER, parent_id INTEGER
);
CREATE INDEX IF NOT EXISTS actions_at ON actions(at);
CREATE INDEX IF NOT EXISTS actions_status ON actions(status);
CREATE INDEX IF NOT EXISTS actions_kind ON actions(action, status, at);
CREATE INDEX IF NOT EXISTS actions_target ON actions(target, at);
CREATE TABLE IF NOT EXISTS replacements (
  old_id TEXT PRIMARY KEY, new_label TEXT NOT NULL, new_id TEXT, created_at REAL NOT NULL,
  deadline REAL NOT NULL, state TEXT NOT NULL, action_id INTEGER
);
"""
    COLUMNS = (("actions", "token", "INTEGER"),)  # the lease's token an action was taken under

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.fence: Fence | None = None  # set while this process leads (controller/store/lease.py)

    # ---- writing ---------------------------------------------------------------------------
    def record(
        self,
        *,
        tick_id: int | None,
        now: float,
        action: str,
        target: str,
        params: dict[str, Any],
        proposer: str,
        reason: str,
        confidence: float | None,
        verdict: str,
        why: str,
        guard: str = "",
        status: str,
        key: str | None = None,
        escalation_id: int | None = None,
        parent_id: int | None = None,
    ) -> int:
        """Write one decision. For `act`, status is `intent`: written before the provider call.

        While this process leads (`fence` set), an action to execute is written only if the
        lease is still this process's and unexpired, by the store's clock, in the same
        transaction; otherwise `StaleLeader` and nothing is written or done."""
        with self.tx() as db:
            token = self._check_fence(db) if verdict == "act" else None
            return db.insert(
                "INSERT INTO actions(tick_id, at, action, target, params, proposer, reason, "
                "confidence, verdict, why, guard, status, key, escalation_id, parent_id, token) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (tick_id, now, action, target, dumps(params), proposer, reason, confidence,
                 verdict, why, guard, status, key, escalation_id, parent_id, token),
            )  # fmt: skip

    def import_launches(self, rented: Sequence[tuple[str, str]], at: float, proposer: str) -> None:
        """Record (instance id, label) pairs rented outside this journal's ticks (a benchmark's
        world of thousands, built at once) as one launch and its children at `at`, in one
        transaction: the instances are then this journal's, as if its launches had rented them
        (at a time before the launch budgets' windows, they spend none of them)."""
        with self.tx() as db:
            parent = db.insert(
                "INSERT INTO actions(at, action, target, params, proposer, reason, verdict, why, "
                "status) VALUES (?, 'launch', 'fleet', ?, ?, 'imported', 'act', 'imported', "
                "'ok')", (at, dumps({"count": len(rented)}), proposer),
            )  # fmt: skip
            db.executemany(
                "INSERT INTO actions(at, action, target, params, proposer, reason, verdict, why, "
                "status, key, parent_id, result) VALUES (?, 'launch', 'fleet', ?, ?, 'imported', "
                "'act', 'imported', 'ok', ?, ?, ?)",
                [(at, dumps({"label": label}), proposer, label, parent,
                  dumps({"instance": iid, "label": label})) for iid, label in rented],
            )  # fmt: skip

    def check_fence(self, db: Tx | None = None) -> None:
        """`StaleLeader` unless the lease this process acts under is still its own and
        unexpired (by the store's clock); nothing to check while it holds none. In `db`, the
        caller's open transaction, when given (what it writes then commits under the lease)."""
        if self.fence is None:
            return
        if db is not None:
            self._check_fence(db)
            return
        with self.tx() as own:
            self._check_fence(own)

    def _check_fence(self, db: Tx) -> int | None:
        fence = self.fence
        if fence is None:
            return None
        row = db.execute(
            "SELECT holder, token, expires_at FROM leases WHERE name = ?" + db.lock_rows,
            (fence.name,),
        ).fetchone()
        now = db.clock()
        if row is None or int(row["token"]) != fence.token or row["holder"] != fence.holder:
            held = f"{row['holder']} (token {row['token']})" if row else "nobody"
            raise StaleLeader(f"lease {fence.name!r} is held by {held}, not by {fence.holder} "
                              f"(token {fence.token}): action refused")  # fmt: skip
        if float(row["expires_at"]) <= now:
            raise StaleLeader(f"lease {fence.name!r} of {fence.holder} (token {fence.token}) "
                              f"expired {now - float(row['expires_at']):.1f} s ago: "
                              "action refused")  # fmt: skip
        return fence.token

    def finish(self, action_id: int, now: float, status: str, result: dict[str, Any]) -> None:
        with self.tx() as db:
            # an outcome that changes (a launch given up on as lost, listed late after all)
            # keeps what it counted in the totals: the metrics' counters never go down
            before = db.execute("SELECT action, status, proposer FROM actions WHERE id = ?",
                                (action_id,)).fetchall()  # fmt: skip
            totals.fold(db, "actions", [r for r in before if r["status"] not in UNDECIDED
                                        and r["status"] != status])  # fmt: skip
            db.execute(
                "UPDATE actions SET status = ?, result = ?, finished_at = ? WHERE id = ?",
                (status, dumps(result), now, action_id),
            )

    def veto_intent(self, action_id: int, guard: str, why: str) -> bool:
        """An intent that will not be carried out after all (the pause switch was set after
        its tick decided): the row is vetoed by `guard`, as if the guards had refused it; False
        if it is no longer an intent."""
        with self.tx() as db:
            cur = db.execute(
                "UPDATE actions SET verdict = 'veto', status = 'vetoed', guard = ?, why = ? "
                "WHERE id = ? AND status = 'intent'",
                (guard, why, action_id),
            )
            return cur.rowcount == 1

    def close_interrupted(self, now: float, listed: set[str] | None = None) -> list[Row]:
        """Intents left by a run that stopped between intent and result (not single launches:
        those are reconciled by their label), closed and returned. With the provider's listing
        (`listed`: instance ids), a destroy whose target is gone is recorded as done;
        everything else (a launch of several included: its single launches go on being
        reconciled) as `interrupted`, and the rules decide again from what is sensed."""
        rows = self._all("SELECT id, action, target FROM actions WHERE status = 'intent' AND "
                         "(action != 'launch' OR parent_id IS NULL) ORDER BY id")  # fmt: skip
        for r in rows:
            target = str(r["target"]).removeprefix("instance:")
            if r["action"] == "destroy" and listed is not None and target not in listed:
                r["status"] = "ok"
                self.finish(int(r["id"]), now, "ok", {"instance": target,
                                                      "confirmed_by": "listing"})  # fmt: skip
                continue
            r["status"] = "interrupted"
            self.finish(int(r["id"]), now, "interrupted", {"note": INTERRUPTED_NOTE})
        return rows

    # ---- reading ---------------------------------------------------------------------------
    def recent(self, limit: int = 100, *, executed_only: bool = False) -> list[Row]:
        """The last `limit` actions (or only those executed), oldest first, decoded."""
        where = "WHERE verdict = 'act'" if executed_only else ""
        rows = self._all(f"SELECT * FROM actions {where} ORDER BY id DESC LIMIT ?", (limit,))
        return _decoded(rows[::-1])

    def in_flight(self) -> list[Row]:
        return self._all("SELECT * FROM actions WHERE status = 'intent' ORDER BY id")

    def recent_for(self, target: str, since: float) -> list[Row]:
        rows = self._all(
            "SELECT at, action, params, status, proposer FROM actions WHERE target = ? "
            "AND verdict = 'act' AND at >= ? ORDER BY id",
            (target, since),
        )
        for r in rows:
            r["params"] = loads(r["params"], {})
        return rows

    def actions_for_escalation(self, esc_id: int) -> list[Row]:
        rows = self._all("SELECT * FROM actions WHERE escalation_id = ? ORDER BY id", (esc_id,))
        return _decoded(rows)

    def acted_on(self, esc_ids: Sequence[int]) -> dict[int, tuple[int, str]]:
        """Escalation id -> (action id, status) of the action each of these escalations' answers
        set out to carry out (its intent written), if any: an answer carried out, or begun by a
        run that stopped before marking its escalation, is never carried out again."""
        if not esc_ids:
            return {}
        marks = ", ".join("?" * len(esc_ids))
        rows = self._all(f"SELECT id, escalation_id, status FROM actions WHERE escalation_id IN "
                         f"({marks}) AND verdict = 'act' AND parent_id IS NULL ORDER BY id",
                         tuple(esc_ids))  # fmt: skip
        return {int(r["escalation_id"]): (int(r["id"]), str(r["status"])) for r in rows}

    def destroyed_since(self, since: float) -> set[str]:
        """Instances we destroyed (or set out to) since `since`."""
        rows = self._all("SELECT target FROM actions WHERE action = 'destroy' AND verdict = 'act' "
                         "AND status IN ('ok', 'intent') AND at >= ?", (since,))  # fmt: skip
        return {str(r["target"]).removeprefix("instance:") for r in rows}

    # ---- launches not yet confirmed by a listing -------------------------------------------
    def recent_launches(self, since: float) -> list[Row]:
        """Single launches (one row each, keyed by label): every one still open (intent or
        unknown outcome, however old), and those that succeeded, failed or were given up on
        as lost since `since` (the label of one that failed or was lost, listed after all, is
        its instance, confirmed late)."""
        head = "SELECT id, at, status, key, result FROM actions WHERE action = 'launch' AND "
        rows = self._all(head + "parent_id IS NOT NULL AND status IN ('intent', 'unknown')")
        rows += self._all(head + "parent_id IS NOT NULL AND status IN ('ok', 'lost', 'failed') "
                          "AND at >= ?", (since,))  # fmt: skip
        rows.sort(key=lambda r: int(r["id"]))
        for r in rows:
            r["result"] = loads(r["result"], {})
        return rows

    def open_launches(self) -> dict[int, str]:
        """Action id -> label of the single launches whose create is not known to have rented
        (intent, an unknown outcome, given up on as lost, or failed: a create vast lists
        later than fleetgate waited for, or that vast answered with an error and rented anyway,
        rented under that unique label): an instance listed with one is fleetgate's."""
        rows = self._all("SELECT id, key FROM actions WHERE action = 'launch' AND parent_id IS "
                         "NOT NULL AND status IN ('intent', 'unknown', 'lost', "
                         "'failed')")  # fmt: skip
        return {int(r["id"]): str(r["key"]) for r in rows if r["key"]}

    def rented_by(self, action_ids: Sequence[int]) -> list[tuple[int, str, str]]:
        """(action id, instance id, label) of those of these launches that rented (a create
        confirmed late, say)."""
        if not action_ids:
            return []
        marks = ", ".join("?" * len(action_ids))
        rows = self._all(f"SELECT id, result FROM actions WHERE id IN ({marks}) AND status = "
                         "'ok' ORDER BY id", tuple(action_ids))  # fmt: skip
        return [(int(r["id"]), str(res["instance"]), str(res.get("label", "")))
                for r in rows if (res := loads(r["result"], {})).get("instance")]  # fmt: skip

    def launched_after(self, action_id: int) -> list[tuple[int, str, str]]:
        """(action id, instance id, label) of every single launch that rented an instance,
        after action `action_id`: the instances fleetgate owns whatever vast lists as label."""
        rows = self._all("SELECT id, result FROM actions WHERE action = 'launch' AND status = 'ok' "
                         "AND parent_id IS NOT NULL AND id > ? ORDER BY id",
                         (action_id,))  # fmt: skip
        out = []
        for r in rows:
            result = loads(r["result"], {})
            if result.get("instance"):
                out.append((int(r["id"]), str(result["instance"]), str(result.get("label", ""))))
        return out

    # ---- replacements in flight ------------------------------------------------------------
    def add_replacement(
        self, old_id: str, new_label: str, now: float, deadline: float, action_id: int
    ) -> None:
        with self.tx() as db:
            db.execute(
                "INSERT INTO replacements(old_id, new_label, created_at, deadline, state, "
                "action_id) VALUES (?, ?, ?, ?, 'waiting', ?) ON CONFLICT(old_id) DO UPDATE SET "
                "new_label = excluded.new_label, new_id = NULL, created_at = excluded.created_at, "
                "deadline = excluded.deadline, state = 'waiting', action_id = excluded.action_id",
                (old_id, new_label, now, deadline, action_id),
            )

    def replacements(self, state: str = "waiting") -> list[Row]:
        return self._all("SELECT * FROM replacements WHERE state = ? ORDER BY created_at", (state,))

    def set_replacement(self, old_id: str, state: str, new_id: str | None = None) -> None:
        with self.tx() as db:
            db.execute(
                "UPDATE replacements SET state = ?, new_id = COALESCE(?, new_id) WHERE old_id = ?",
                (state, new_id, old_id),
            )
