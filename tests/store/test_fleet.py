"""The contract of `journal.fleet`: tracks saved by change and read back by any process,
events, hosts, and the history a tick decides from."""

from __future__ import annotations

from support import peer, record_action

from controller.core.track import Event, Track
from controller.store.fleet import HISTORY_WINDOW_S, TRACKS_VERSION, UPTIME_EVERY
from controller.store.journal import Journal


def _track(i: str, uptime: float, stage: str = "running") -> Track:
    return Track(i, "m" + i, 0, stage, 0, "running", 0, "up", 0, uptime=uptime)


def _act(j: Journal, now: float, action: str, target: str, **kw: object) -> int:
    return record_action(j, now, action, target, **{"status": "ok", **kw})


def test_history_is_rebuilt_from_what_was_stored(j: Journal) -> None:
    t = Track("1", "m1", 0, "running", 0, "running", 0, "up", 0)
    j.fleet.save_tracks(
        {"1": t},
        [
            Event("1", 50, "death"),
            Event("1", 60, "restart"),
            Event("1", 60, "bench", {"machine_id": "m1", "rate": 33.0}),
        ],
    )
    parent = _act(j, 70.0, "launch", "fleet", params={"count": 1})
    _act(j, 70.0, "launch", "fleet", key="k", parent_id=parent)
    j.fleet.block_host("m9", 500.0, "crash loop")
    j.actions.add_replacement("1", "lbl", 80.0, 2000.0, parent)
    j.actions.add_replacement("2", "lbl2", 80.0, 2000.0, parent)
    j.actions.set_replacement("2", "waiting", new_id="5")
    h = j.fleet.history(100.0)
    assert h.instances == {"1": t}
    assert [e.kind for e in h.events] == ["death", "restart"]
    assert h.host_rates == {"m1": 33.0} and h.host_blocks == {"m9": 500.0}
    assert h.host_failures == {"m9": 1}
    assert h.launches == (70.0,) and h.retiring == frozenset({"1", "2"})
    assert h.replacing == frozenset({"5"})
    assert h.last_acted == {"launch:fleet": 70.0}
    assert h.host_blocked("m9", 100.0) and not h.host_blocked("m9", 600.0)


def test_history_keeps_to_its_window_and_to_what_was_acted_on(j: Journal) -> None:
    now = 100_000.0
    old = now - HISTORY_WINDOW_S - 1
    j.fleet.save_tracks({}, [Event("1", old, "death"), Event("1", now - 5, "death"),
                             Event("1", now - 5, "seen")])  # fmt: skip
    _act(j, old, "reboot", "instance:1")
    _act(j, now - 9, "reboot", "instance:1")
    _act(j, now - 8, "reboot", "instance:1", status="failed")  # failed: not acted
    _act(j, now - 7, "hold", "fleet", verdict="veto", status="vetoed")
    _act(j, now - 6, "launch", "fleet", key="a", parent_id=1, status="unknown")
    _act(j, now - 6, "launch", "fleet", key="b", parent_id=1, status="failed")
    h = j.fleet.history(now)
    assert [(e.at, e.kind) for e in h.events] == [(now - 5, "death")]
    assert h.last_acted == {"reboot:instance:1": now - 9, "launch:fleet": now - 6}
    assert h.launches == (now - 6,)  # an unknown outcome may have rented one


def test_history_read_inside_an_open_transaction_sees_its_writes(j: Journal) -> None:
    with j.tx():
        j.fleet.save_tracks({"1": _track("1", 10)}, [])
        _act(j, 50.0, "reboot", "instance:1")
        h = j.fleet.history(100.0)
    assert h.instances == {"1": _track("1", 10)} and h.last_acted == {"reboot:instance:1": 50.0}


def test_tracks_events_and_first_sightings(j: Journal) -> None:
    assert not j.fleet.has_tracks() and j.fleet.tracks() == {}
    t = Track("1", "m1", 0, "running", 0, "running", 0, "up", 0)
    j.fleet.save_tracks({"1": t}, [Event("1", 5.0, "seen"), Event("2", 6.0, "seen", {"x": 1})])
    assert j.fleet.has_tracks() and j.fleet.seen_instances(5.5, ["1", "2", "3"]) == {"2"}
    assert j.fleet.seen_instances(0.0, ["1"]) == {"1"} and j.fleet.seen_instances(0.0, []) == set()
    assert [e["detail"] for e in j.fleet.events()] == [{}, {"x": 1}]
    assert [e["kind"] for e in j.fleet.events("2")] == ["seen"]
    assert [e["instance_id"] for e in j.fleet.events(limit=1)] == ["2"]
    j.fleet.save_tracks({}, [])
    assert not j.fleet.has_tracks()


def test_tracks_are_saved_by_change_and_read_back_by_any_process(j: Journal) -> None:
    j.fleet.save_tracks({"1": _track("1", 10), "2": _track("2", 10)}, [])
    other = peer(j)
    assert other.fleet.tracks() == {"1": _track("1", 10), "2": _track("2", 10)}
    # uptime alone: this process sees it at once, others within UPTIME_EVERY saves
    j.fleet.save_tracks({"1": _track("1", 40), "2": _track("2", 40, stage="params")}, [])
    assert j.fleet.history(0.0).instances == {"1": _track("1", 40),
                                              "2": _track("2", 40, "params")}  # fmt: skip
    seen = other.fleet.tracks()
    assert seen["2"] == _track("2", 40, "params")  # a stage change is stored at once
    assert seen["1"].stage == "running" and seen["1"].uptime in (10, 40)
    for n in range(UPTIME_EVERY):
        j.fleet.save_tracks({"1": _track("1", 100 + n)}, [])  # 2 vanished: removed at once
        assert set(other.fleet.tracks()) == {"1"}
    assert other.fleet.tracks()["1"].uptime >= 100  # written within UPTIME_EVERY saves
    # another process saving makes this one read the store again
    other.fleet.save_tracks({"3": _track("3", 5)}, [])
    assert j.fleet.tracks() == {"3": _track("3", 5)}
    assert j.fleet.history(0.0).instances == j.fleet.tracks()
    other.close()


def test_a_save_that_moves_uptimes_alone_writes_nothing(j: Journal) -> None:
    assert UPTIME_EVERY > 3
    j.fleet.save_tracks({"1": _track("1", 10)}, [])
    version = j.meta.get(TRACKS_VERSION)
    for uptime in (20, 30):
        j.fleet.save_tracks({"1": _track("1", uptime)}, [])
        assert j.meta.get(TRACKS_VERSION) == version  # nothing written
        assert j.fleet.history(0.0).instances == {"1": _track("1", uptime)}  # this process
    other = peer(j)
    assert other.fleet.tracks() == {"1": _track("1", 10)}  # the stored uptime, as documented
    j.fleet.save_tracks({"1": _track("1", 40)}, [Event("1", 5.0, "death", {})])
    assert j.meta.get(TRACKS_VERSION) != version  # an event: written
    assert [e["kind"] for e in other.fleet.events("1")] == ["death"]
    other.close()


def test_hosts_written_here_or_elsewhere_read_back_the_same(j: Journal) -> None:
    j.fleet.save_tracks({}, [Event("1", 5.0, "bench", {"machine_id": "m1", "rate": 30.0})])
    assert j.fleet.history(10.0).host_rates == {"m1": 30.0}
    j.fleet.block_host("m1", 100.0, "crash loop")
    other = peer(j)
    assert other.fleet.history(10.0).host_blocks == {"m1": 100.0}
    other.fleet.block_host("m2", 200.0, "slow")  # written elsewhere: this process reads again
    j.fleet.save_tracks({}, [Event("2", 6.0, "bench", {"machine_id": "m1", "rate": 35.0})])
    h = j.fleet.history(10.0)
    assert h.host_rates == {"m1": 35.0} and h.host_blocks == {"m1": 100.0, "m2": 200.0}
    assert [(r["machine_id"], r["failures"]) for r in j.fleet.hosts()] == [("m1", 1), ("m2", 1)]
    j.fleet.hosts()[0]["failures"] = 99  # a caller's copy, not the journal's
    assert j.fleet.hosts()[0]["failures"] == 1 and other.fleet.hosts() == j.fleet.hosts()
    other.close()


def test_a_host_blocked_again_counts_its_failures(j: Journal) -> None:
    j.fleet.block_host("m1", 100.0, "crash loop")
    j.fleet.block_host("m1", 200.0, "again")
    [host] = j.fleet.hosts()
    assert (host["failures"], host["blocked_until"], host["block_reason"]) == (2, 200.0, "again")
    assert j.fleet.history(0.0).host_failures == {"m1": 2}


def test_a_track_stored_before_answered_was_kept_takes_it_from_ever_up(j: Journal) -> None:
    """Tracks saved by an earlier version lack `answered`: read back with False, every daemon
    down after an upgrade was asked about instead of restarted until it answered again."""
    from controller.store.aggregate import dumps

    saved = {**_track("1", 10)._asdict(), "ever_up": True}
    del saved["answered"]
    never = {**_track("2", 10)._asdict(), "ever_up": False}
    del never["answered"]
    with j.tx() as db:
        db.executemany("INSERT INTO tracks (id, data) VALUES (?, ?)",
                       [("1", dumps(saved)), ("2", dumps(never))])  # fmt: skip
    other = peer(j)
    tracks = other.fleet.tracks()
    other.close()
    assert (tracks["1"].answered, tracks["2"].answered) == (True, False)


def test_a_track_stored_before_died_was_kept_knows_a_daemon_down_after_a_death(
    j: Journal,
) -> None:
    """Tracks saved by the previous release lack `started` and `died`: read back with died
    False, every daemon down on a running instance at the upgrade came back as a start, not a
    restart, and the crash-loop rules never counted it. Down on a running instance it had
    served on is a death (the previous release counted its return as a restart); down on a
    stopped one, a warm pool's stop."""
    from controller.store.aggregate import dumps

    def old(i: str, status: str, daemon: str, ever_up: bool) -> dict[str, object]:
        saved = {**_track(i, 10)._asdict(), "status": status, "daemon": daemon,
                 "ever_up": ever_up}  # fmt: skip
        del saved["started"], saved["died"]
        return saved

    rows = [old("1", "running", "down", True), old("2", "stopped", "down", True),
            old("3", "running", "down", False), old("4", "running", "up", True)]  # fmt: skip
    with j.tx() as db:
        db.executemany("INSERT INTO tracks (id, data) VALUES (?, ?)",
                       [(r["id"], dumps(r)) for r in rows])  # fmt: skip
    other = peer(j)
    tracks = other.fleet.tracks()
    other.close()
    assert {i: t.died for i, t in tracks.items()} == {"1": True, "2": False, "3": False,
                                                      "4": False}  # fmt: skip
    assert all(t.started is None for t in tracks.values())
