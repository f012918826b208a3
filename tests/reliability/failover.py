"""Two `fleetgate run` processes on one PostgreSQL journal: the leader killed, or paused.

Both run the same config (the real fleet: FakeVast in this process, Curio's queue in
PostgreSQL; lease ttl 4 s, renewed every 1 s, margin 1 s; a tick every 0.5 s) and compete for
the lease; the one that wins launches for the queue.

failover(n)         the leader is killed with SIGKILL at a random moment while it works;
                    failover = seconds from the kill to the standby holding the lease (polled
                    with `controller.store.lease.read` every 20 ms); the standby then acts.
paused_leader(n)    the leader is stopped with SIGSTOP just after one of its creates reached
                    the provider (a launch in flight, more to go), until the standby holds the
                    lease; then SIGCONT: it wakes believing it leads.

Harm counters (all must be 0):

    shared_terms      a lease term (fencing token) whose actions more than one process took
    wrong_holder      actions of a term taken by a process that did not hold that term
    unfenced          an executed action recorded without a token (nothing checked it)
    acts_after_loss   actions recorded, or provider calls made, by the killed or paused
                      leader after the kill or the takeover
    slow_failovers    no takeover, or one later than ttl_s + 0.5 s after the kill
    duplicates        a label created twice at the provider

Who took an action comes from each process's DEBUG log (`action #N ... by ...`, or for a
launch cut short, `vast: launch 'LABEL'` of one of its per-label rows); a per-label row
belongs to the process that took its parent.
"""

from __future__ import annotations

import os
import random
import re
import signal
import statistics
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from fakes.vast_server import Delay
from reliability.procs import PG_DSN, Rig, wait_for

from controller.store.backend import PostgresStore
from controller.store.journal import Journal
from controller.store.lease import LeaseState, read

HARMS = ("shared_terms", "wrong_holder", "unfenced", "acts_after_loss", "slow_failovers",
         "duplicates")  # fmt: skip
TTL_S = 4.0
LEASE = f"ttl_s: {TTL_S}, renew_s: 1, margin_s: 1"
SLACK_S = 0.0  # a dead leader is replaced within ttl_s (controller/store/lease.py)
ACTION = re.compile(r"^action #(\d+) (?!.* was interrupted: ).* by \S+: ")  # act.py's line
LAUNCH = re.compile(r"^vast: launch '([^']+)' on offer")


class Pair:
    """The two controllers of one run and what the harness saw of the lease."""

    def __init__(self, rig: Rig) -> None:
        self.rig = rig
        self.journal = Journal(PostgresStore(PG_DSN, rig.schema))
        self.procs = [rig.spawn("run", level="DEBUG") for _ in range(2)]
        self.holders: dict[int, str] = {}  # token -> holder, as polled

    def lease(self) -> LeaseState:
        state = read(self.journal)
        if state.live and state.holder is not None:
            self.holders.setdefault(state.token, state.holder)
        return state

    def leader(self, timeout_s: float = 60) -> subprocess.Popen[bytes] | None:
        if not wait_for(lambda: self.lease().live, timeout_s, 0.05):
            return None
        pid = int(str(self.lease().holder).rsplit(":", 1)[1])
        return next((p for p in self.procs if p.pid == pid), None)

    def acted(self, token: int, timeout_s: float) -> bool:
        query = "SELECT 1 AS x FROM actions WHERE verdict = 'act' AND token = ?"
        return wait_for(lambda: bool(self.rig.query(query, (token,))), timeout_s, 0.05)

    def max_id(self) -> int:
        return max((int(r["id"]) for r in self.rig.query("SELECT id FROM actions")), default=0)

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.journal.close()

    def actors(self) -> dict[int, int]:
        """Action id -> pid of the process that took it (parents from logs, children by parent)."""
        by_id: dict[int, int] = {}
        by_label: dict[str, int] = {}
        for p in self.procs:
            for rec in self.rig.log(p):
                msg = str(rec.get("msg", ""))
                if m := ACTION.match(msg):
                    by_id[int(m[1])] = p.pid
                elif m := LAUNCH.match(msg):
                    by_label[m[1]] = p.pid
        children = self.rig.query("SELECT id, parent_id, key FROM actions "
                                  "WHERE parent_id IS NOT NULL")  # fmt: skip
        for r in children:  # a parent killed or refused mid-launch: by its children's calls
            if r["key"] in by_label:
                by_id.setdefault(int(r["parent_id"]), by_label[r["key"]])
        for r in children:
            if int(r["parent_id"]) in by_id:
                by_id[int(r["id"])] = by_id[int(r["parent_id"])]
        return by_id


def _check(pair: Pair, harms: Counter[str], stats: Counter[str], details: list[str],
           tag: str) -> list[dict[str, Any]]:  # fmt: skip
    rows = pair.rig.query("SELECT id, action, token, parent_id, key, status FROM actions "
                          "WHERE verdict = 'act' ORDER BY id")  # fmt: skip
    actors = pair.actors()
    terms: dict[int, set[int]] = {}
    for r in rows:
        if r["token"] is None:
            harms["unfenced"] += 1
            details.append(f"{tag}: action #{r['id']} {r['action']} has no token")
            continue
        pid = actors.get(int(r["id"]))
        if pid is None:
            stats["unattributed"] += 1  # killed before it logged the action
            continue
        terms.setdefault(int(r["token"]), set()).add(pid)
    for token, pids in terms.items():
        holder = pair.holders.get(token, "")
        if len(pids) > 1:
            harms["shared_terms"] += 1
            details.append(f"{tag}: term {token} acted on by processes {sorted(pids)}")
        if holder and any(not holder.endswith(f":{pid}") for pid in pids):
            harms["wrong_holder"] += 1
            details.append(f"{tag}: term {token} held by {holder}, acted on by {sorted(pids)}")
    stats["terms"] += len(terms)
    stats["actions"] += len(rows)
    for label, n in pair.rig.vast.creates_by_label.items():
        if n > 1:
            harms["duplicates"] += n - 1
            details.append(f"{tag}: label {label!r} created {n} times")
    return rows


def _creates_by(pair: Pair, pid: int, since: int) -> list[str]:
    """Labels `pid`'s launches asked the provider for from request number `since` on."""
    actors = pair.actors()
    rows = pair.rig.query("SELECT id, key FROM actions WHERE key IS NOT NULL")
    mine = {r["key"] for r in rows if actors.get(int(r["id"])) == pid}
    with pair.rig.vast.lock:
        later = pair.rig.vast.requests[since:]
    labels = [r.body.get("label") for r in later
              if r.endpoint == "create" and isinstance(r.body, dict)]  # fmt: skip
    return sorted({str(x) for x in labels if x in mine})


def _start(rig: Rig, tag: str, harms: Counter[str], details: list[str]) -> tuple[Pair, Any]:
    rig.db.post("PoRep", 4)
    pair = Pair(rig)
    leader = pair.leader()
    if leader is None or not pair.acted(pair.lease().token, 60):
        harms["slow_failovers"] += 1
        details.append(f"{tag}: no leader acted within 60 s")
        return pair, None
    return pair, leader


def _takeover(pair: Pair, old_token: int, since: float) -> float | None:
    if not wait_for(lambda: pair.lease().token > old_token and pair.lease().live, 30, 0.02):
        return None
    return time.monotonic() - since


def _timing(harms: Counter[str], details: list[str], tag: str, took: float | None,
            times: list[float]) -> None:  # fmt: skip
    if took is None or took > TTL_S + SLACK_S:
        harms["slow_failovers"] += 1
        details.append(f"{tag}: takeover after {took} s (ttl {TTL_S} s)")
    if took is not None:
        times.append(took)


@dataclass
class _Tally:
    """What a scenario's runs found: harms (each must stay 0), counts, details, failover times."""

    harms: Counter[str] = field(default_factory=lambda: Counter({k: 0 for k in HARMS}))
    stats: Counter[str] = field(default_factory=Counter)
    details: list[str] = field(default_factory=list)
    times: list[float] = field(default_factory=list)

    def result(self) -> dict[str, Any]:
        return {**self.harms, **self.stats, **_summary(self.times), "details": self.details}


def _runs(
    name: str, n: int, seed: int, t: _Tally,
    before: Callable[[Rig, random.Random], None] | None = None,
) -> Iterator[tuple[random.Random, str, Rig, Pair, Any]]:  # fmt: skip
    """`n` runs, each a fresh PostgreSQL rig with two controllers, handed over once one leads."""
    rng = random.Random(seed)
    for i in range(n):
        tag = f"{name} run {i}"
        with Rig("postgres", lease=LEASE, interval_s=0.5) as rig:
            if before is not None:
                before(rig, rng)
            pair, leader = _start(rig, tag, t.harms, t.details)
            if leader is None:
                pair.stop()
                continue
            yield rng, tag, rig, pair, leader


def failover(n: int, seed: int) -> dict[str, Any]:
    t = _Tally()

    def slow_creates(rig: Rig, rng: random.Random) -> None:
        rig.vast.script("create", *[Delay(rng.uniform(0, 0.3)) for _ in range(40)])

    for rng, tag, rig, pair, leader in _runs("failover", n, seed, t, slow_creates):
        token = pair.lease().token
        rig.db.post("PoRep", 4)  # more to launch: the kill may land mid-launch
        time.sleep(rng.uniform(0, 1.5))
        os.kill(leader.pid, signal.SIGKILL)
        killed = time.monotonic()
        leader.wait()
        time.sleep(0.2)  # a COMMIT it sent just before dying may still be applied
        last = pair.max_id()
        t.stats["kills"] += 1
        _timing(t.harms, t.details, tag, _takeover(pair, token, killed), t.times)
        rig.db.post("PoRep", 4)
        t.stats["standby_acted"] += pair.acted(token + 1, 30)
        pair.stop()
        rows = _check(pair, t.harms, t.stats, t.details, tag)
        late = [r for r in rows if r["token"] == token and int(r["id"]) > last]
        t.harms["acts_after_loss"] += len(late)
        t.details += [f"{tag}: action #{r['id']} of the dead leader after the kill" for r in late]
        mine = [r for r in rows if r["token"] == token]
        t.stats["intents_left_by_kill"] += sum(r["status"] == "intent" for r in mine)
        t.stats["closed_as_interrupted"] += sum(r["status"] == "interrupted" for r in mine)
    return t.result()


def _summary(times: list[float]) -> dict[str, Any]:
    if not times:
        return {"failovers": 0}
    return {"failovers": len(times), "failover_max_s": round(max(times), 2),
            "failover_mean_s": round(statistics.fmean(times), 2), "ttl_s": TTL_S}  # fmt: skip


def paused_leader(n: int, seed: int) -> dict[str, Any]:
    t = _Tally()
    for rng, tag, rig, pair, leader in _runs("paused", n, seed, t):
        token = pair.lease().token
        settled = "SELECT 1 AS x FROM actions WHERE status = 'intent'"
        wait_for(lambda: not rig.query(settled), 30, 0.05)  # noqa: B023 - its first launch
        rig.vast.script("create", *[Delay(rng.uniform(0.2, 0.5)) for _ in range(40)])
        before = len(rig.vast.of("create"))
        rig.db.post("PoRep", 6)  # three more launches, each slow: stopped in the first
        if not wait_for(lambda: len(rig.vast.of("create")) > before, 30, 0.002):  # noqa: B023
            t.details.append(f"{tag}: the leader never launched again")
        os.kill(leader.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        since = len(rig.vast.requests)
        t.stats["stops"] += 1
        _timing(t.harms, t.details, tag, _takeover(pair, token, stopped), t.times)
        rig.db.post("PoRep", 2)
        os.kill(leader.pid, signal.SIGCONT)
        wait_for(lambda: "lost the lease" in str(rig.log(leader)), 5, 0.05)  # noqa: B023
        time.sleep(1.5)  # a renewal and three ticks more of the woken leader
        t.stats["standby_acted"] += pair.acted(token + 1, 10)
        pair.stop()
        _check(pair, t.harms, t.stats, t.details, tag)
        after = _creates_by(pair, leader.pid, since)
        t.harms["acts_after_loss"] += len(after)
        t.details += [f"{tag}: the paused leader created {x!r} after the takeover" for x in after]
        log = [str(r.get("msg", "")) for r in rig.log(leader)]
        t.stats["refused"] += sum("action refused" in x for x in log)
        t.stats["noticed_loss"] += any("lost the lease" in x for x in log)
    return t.result()
