"""The controller killed with SIGKILL at random points of a tick with launches in flight.

Each run: a fresh FakeVast (its creates slowed by 0-300 ms; 8% answered with a 500 after
renting, 8% answered after the client's timeout, 4% refused), a Curio queue of 8-12 pending
tasks (4-6 launches in one tick), and `fleetgate tick` as a subprocess, killed with SIGKILL at
a random moment: in two runs of six in the middle of its first create (slowed to 150-300 ms,
killed 0-100 ms after it reached the provider); in the others, by lot, one in seven while it
starts (imports, journal, lease), two in seven at a uniform point of the tick (from its first
provider request), four in seven 0-100 ms after its k-th create request (k = 1..3) reached
the provider. Once the creates it left in flight have
landed and its lease has run out, one recovery `fleetgate tick` runs to the end, and the
provider's truth is compared with the journal:

    duplicates      a label created twice, or more creates than journaled launches
    lost_records    an instance at the provider whose label no journal action has as its key
    over_target     more instances after the recovery than the queue asks for
    open_listed     a launch left open (intent/unknown) by the killed run although the
                    recovery tick's listing showed its label
    stale_intents   a launch of the killed run still open after a recovery tick past the
                    pending window (listed or not)
    open_parents    a launch action (the parent of the per-label rows) still `intent`
    bad_journal     SQLite's integrity check fails, a PostgreSQL journal cannot be read, an
                    `ok` action without a result, or the recovery tick failed

One run in three gives the recovery tick a short `launch_pending_s`, as if it ran after the
pending window. Every other run keeps the journal on PostgreSQL (a fresh schema, dropped).
"""

from __future__ import annotations

import math
import os
import random
import signal
import time
from collections import Counter
from typing import Any

from fakes.vast_server import Delay, Lost, Status
from reliability.procs import Rig, wait_for

HARMS = ("duplicates", "lost_records", "over_target", "open_listed", "stale_intents",
         "open_parents", "bad_journal")  # fmt: skip
LEASE = "ttl_s: 2.5, renew_s: 1, margin_s: 0.5"
TICK_SPAN_S = 1.8  # first provider request to exit, with 4-6 slowed creates
LATE_ANSWER_S, CLIENT_TIMEOUT_S = 0.9, 0.7
SHORT_WINDOW_S = 0.5


def _create_faults(rng: random.Random, n: int) -> list[Any]:
    out: list[Any] = []
    for _ in range(n):
        r = rng.random()
        if r < 0.08:
            out.append(Lost(Status(500)))  # rented, the answer lost
        elif r < 0.16:
            out.append(Delay(LATE_ANSWER_S))  # rented after the client gave up
        elif r < 0.2:
            out.append(Status(503))  # refused: the tick stops launching
        else:
            out.append(Delay(rng.uniform(0, 0.3)))
    return out


def _kill(rig: Rig, proc: Any, rng: random.Random, stats: Counter[str], plan: str) -> float:
    """Kill at a random point of `plan` (start, tick, create, mid_create); returns the
    monotonic time of the kill (or of its exit, if it finished first)."""
    spawned = time.monotonic()
    done = proc.poll
    if plan == "start":
        wait_for(lambda: done() is not None, rng.uniform(0.2, 1.3))
    elif plan == "tick":
        wait_for(lambda: rig.vast.requests or done() is not None, 60, 0.002)
        wait_for(lambda: done() is not None, rng.uniform(0, TICK_SPAN_S), 0.002)
    else:
        k = 1 if plan == "mid_create" else rng.randint(1, 3)
        wait_for(lambda: len(rig.vast.of("create")) >= k or done() is not None, 60, 0.002)
        wait_for(lambda: done() is not None, rng.uniform(0, 0.1), 0.002)
    started = bool(rig.vast.requests)
    if done() is None:
        os.kill(proc.pid, signal.SIGKILL)
        stats["kills"] += 1
        stats["kills_in_tick" if started else "kills_at_start"] += 1
    else:
        stats["finished_first"] += 1
    proc.wait()
    stats["kill_after_ms"] += int(1000 * (time.monotonic() - spawned))
    return time.monotonic()


def _snapshot(rig: Rig, stats: Counter[str]) -> None:
    """What the kill left: launches open in the journal, and whether their labels exist."""
    if not rig.journal_exists():
        stats["killed_before_journal"] += 1
        return
    if rig.readable():
        stats["bad_journal_at_kill"] += 1
        return
    rows = rig.actions()
    created = set(rig.vast.creates_by_label)
    open_ = [r for r in rows if r["action"] == "launch" and r["parent_id"] is not None
             and r["status"] in ("intent", "unknown")]  # fmt: skip
    intents = [r for r in open_ if r["status"] == "intent"]
    stats["runs_open_intent_at_kill"] += bool(intents)
    stats["runs_mid_create"] += any(r["key"] in created for r in intents)
    stats["phantom_intents"] += sum(r["key"] not in created for r in intents)
    stats["unknown_at_kill"] += sum(r["status"] == "unknown" for r in open_)


def _check(rig: Rig, target: int, past_window: bool, harms: Counter[str],
           details: list[str], tag: str) -> None:  # fmt: skip
    problem = rig.readable()
    if problem:
        harms["bad_journal"] += 1
        details.append(f"{tag}: journal unreadable: {problem}")
        return
    rows = rig.actions()
    last_tick = max((int(t["id"]) for t in rig.query("SELECT id FROM ticks")), default=0)
    for r in rows:
        if r["status"] == "ok" and r["verdict"] == "act" and r["result"] is None:
            harms["bad_journal"] += 1
            details.append(f"{tag}: action #{r['id']} {r['action']} ok without a result")
    children = [r for r in rows if r["action"] == "launch" and r["parent_id"] is not None]
    keys = {r["key"] for r in children}
    creates = rig.vast.creates_by_label
    for label, n in creates.items():
        if n > 1:
            harms["duplicates"] += n - 1
            details.append(f"{tag}: label {label!r} created {n} times")
    extra = sum(creates.values()) - len(children)
    if extra > 0:
        harms["duplicates"] += extra
        details.append(f"{tag}: {sum(creates.values())} creates, {len(children)} journaled")
    with rig.vast.lock:
        shown = {i.fields["label"] for i in rig.vast._instances.values() if rig.vast._visible(i)}
    for iid, fields in rig.vast.instances.items():
        if fields["label"] not in keys:
            harms["lost_records"] += 1
            details.append(f"{tag}: instance {iid} {fields['label']!r} has no journal record")
    if len(rig.vast.instances) > target:
        harms["over_target"] += 1
        details.append(f"{tag}: {len(rig.vast.instances)} instances for a target of {target}")
    for r in children:
        if r["status"] not in ("intent", "unknown") or r["tick_id"] == last_tick:
            continue
        if past_window:
            harms["stale_intents"] += 1
            details.append(f"{tag}: launch #{r['id']} {r['key']!r} {r['status']} past the window")
        elif r["key"] in shown:
            harms["open_listed"] += 1
            details.append(f"{tag}: launch #{r['id']} {r['key']!r} {r['status']} but listed")
    for r in rows:
        if r["action"] == "launch" and r["parent_id"] is None and r["status"] == "intent":
            harms["open_parents"] += 1
            details.append(f"{tag}: launch action #{r['id']} still intent")


def one_run(i: int, rng: random.Random, backend: str, harms: Counter[str],
            stats: Counter[str], details: list[str]) -> None:  # fmt: skip
    past_window = i % 3 == 2
    tag = f"run {i} ({backend}{', past the window' if past_window else ''})"
    with Rig(backend, lease=LEASE, timeout_s=CLIENT_TIMEOUT_S) as rig:
        tasks = rng.randint(8, 12)
        target = math.ceil(tasks / 2)
        rig.db.post("PoRep", tasks)
        plan = "mid_create" if i % 6 < 2 else rng.choice(["start"] + ["tick"] * 2 + ["create"] * 4)
        first = [Delay(rng.uniform(0.15, 0.3))] if plan == "mid_create" else []
        rig.vast.script("create", *first, *_create_faults(rng, 8 - len(first)))
        rig.vast.late_creates = 0 if past_window else rng.choice([0, 0, 2])
        stats[f"plan_{plan}"] += 1
        killed_at = _kill(rig, rig.spawn("tick"), rng, stats, plan)
        with rig.vast.lock:
            rig.vast._faults.pop("create", None)  # the recovery's creates go through
        time.sleep(max(0.0, killed_at + LATE_ANSWER_S + 0.1 - time.monotonic()))
        _snapshot(rig, stats)
        if rig.journal_exists():
            wait_for(lambda: rig.lease_left() == 0, 10, 0.05)
        guards = f"launch_pending_s: {SHORT_WINDOW_S}" if past_window else ""
        recovery = rig.spawn("tick", config=rig.config("recovery.yaml", guards))
        if recovery.wait(timeout=120) != 0 or any(
            "not ticking" in str(r.get("msg")) for r in rig.log(recovery)
        ):
            harms["bad_journal"] += 1
            details.append(f"{tag}: the recovery tick failed: {rig.log(recovery)[-3:]}")
        stats["creates"] += sum(rig.vast.creates_by_label.values())
        stats["short_of_target"] += max(0, target - len(rig.vast.instances))
        _check(rig, target, past_window, harms, details, tag)


def kill9(n: int, seed: int) -> dict[str, Any]:
    """`n` runs, every other one on PostgreSQL; the result of each backend under `rows`."""
    rng = random.Random(seed)
    rows: dict[str, dict[str, Any]] = {}
    for backend in ("sqlite", "postgres"):
        rows[backend] = {"harms": Counter({k: 0 for k in HARMS}), "stats": Counter(),
                         "details": []}  # fmt: skip
    for i in range(n):
        row = rows["postgres" if i % 2 else "sqlite"]
        row["stats"]["runs"] += 1
        one_run(i, rng, "postgres" if i % 2 else "sqlite", row["harms"], row["stats"],
                row["details"])  # fmt: skip
    out: dict[str, Any] = {"rows": {}}
    for backend, row in rows.items():
        stats = row["stats"]
        runs = max(1, stats["runs"])
        stats["mean_kill_after_ms"] = stats.pop("kill_after_ms", 0) // runs
        out["rows"][backend] = {**row["harms"], **stats, "details": row["details"]}
    for key in HARMS:
        out[key] = sum(r[key] for r in out["rows"].values())
    out["details"] = [d for r in out["rows"].values() for d in r["details"]]
    return out
