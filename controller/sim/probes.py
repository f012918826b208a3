"""cuzk's status server on every simulated instance: the answers the health probe would get.

`SimProbes.check_many` has the signature of `controller.fleet.health.check_many` and answers
the same targets: (public address, public port) pairs that the controller took from vast's listing
(`public_ipaddr` and the `ports` mapping of 9821). A daemon that is up answers with its uptime,
timed by the simulated clock; anything else (daemon down, container not running, nothing at
that address) is down with the reason a real probe would give.

Must not: decide anything; open sockets; read the wall clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, TypeVar

from controller.fleet.health import DaemonHealth
from controller.sim import addresses

if TYPE_CHECKING:
    from controller.sim.instance import SimInstance
    from controller.sim.world import World

K = TypeVar("K")


class SimProbes:
    def __init__(self, world: World, now: Callable[[], float]) -> None:
        self.world = world
        self.now = now
        self.calls: Counter[str] = Counter()

    def check_many(
        self, targets: Mapping[K, tuple[str, int]], timeout_s: float
    ) -> dict[K, DaemonHealth]:
        if not targets:
            return {}
        self.calls["status"] += len(targets)
        where = self._index()
        now = self.now()
        return {key: _answer(where.get(target), target, now, timeout_s)
                for key, target in targets.items()}  # fmt: skip

    def _index(self) -> dict[tuple[str, int], SimInstance]:
        return {(addresses.public_ip(i.machine_id), addresses.status_port(i.id)): i
                for i in self.world.live_instances()}  # fmt: skip


def _answer(
    inst: SimInstance | None, target: tuple[str, int], now: float, timeout_s: float
) -> DaemonHealth:
    netloc = f"{target[0]}:{target[1]}"
    if inst is None or inst.status in ("offline", "exited"):
        return DaemonHealth(False, None, f"cannot connect to {netloc}: Connection refused")
    if inst.status != "running":  # frozen, rebooting: the port does not answer
        return DaemonHealth(False, None, f"timed out after {timeout_s:g}s at {netloc}")
    if inst.daemon != "up" or inst.status_closed:  # a status server off or on 127.0.0.1 only
        return DaemonHealth(False, None, f"cannot connect to {netloc}: Connection refused")
    return DaemonHealth(True, inst.uptime(now), "", now)
