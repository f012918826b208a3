"""Sanity checks on sensing: a listing that lost instances nobody destroyed is doubted.

Pure: an observation and what the journal remembers in, an observation out. A listing that
lost more than half of a fleet of `min_fleet` or more, or lost everything, when our own
destroys do not explain it, is marked failed (an instance listed as not fleetgate's, relabelled
out of the fleet, did not vanish): every fleet change is held, the history is
kept (nothing is marked gone), and one sensing failure is escalated. vast's own API has
answered "no instances" while instances kept billing; this is the last line against it.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

from controller.core.model import Observation, SensorStatus


def check_listing(obs: Observation, tracked: Collection[str], destroyed: Collection[str],
                  min_fleet: int = 4) -> Observation:  # fmt: skip
    """`tracked`: instances the last good listing had; `destroyed`: ones we destroyed since."""
    if not obs.sensor_ok("provider") or not tracked:
        return obs
    listed = {i.id for i in obs.instances}
    # one listed as not fleetgate's (relabelled out of the fleet) is listed: it did not vanish
    unexplained = set(tracked) - listed - {i.id for i in obs.foreign} - set(destroyed)
    everything = not listed and bool(unexplained)
    half = len(tracked) >= min_fleet and len(unexplained) > len(tracked) / 2
    if not (everything or half):
        return obs
    detail = (f"the listing shrank from {len(tracked)} to {len(listed)} instance(s); "
              f"{len(unexplained)} vanished without our actions")  # fmt: skip
    sensors = tuple(SensorStatus("provider", "failed", detail) if s.name == "provider" else s
                    for s in obs.sensors)  # fmt: skip
    return replace(obs, sensors=sensors)
