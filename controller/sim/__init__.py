"""The simulator: a rented GPU fleet and a Curio-like proving queue in virtual time.

It stands in for vast.ai and Curio *below the wire* (`controller.sim.wire`): it answers vast's
HTTP API, Curio's queries, cuzk's status probes, and its instances' agents call the instance
API, so the controller runs its production fleet path on it. No network, no wall clock; all
randomness comes from seeded `random.Random`s.

Must not: import `service`, `tools`, `rules` or `escalation`; nothing but the composition root
(`controller.service`) and the tools imports it.
"""

from controller.sim.config import SimConfig
from controller.sim.simulation import Simulation

__all__ = ["SimConfig", "Simulation"]
