"""The simulator: a rented GPU fleet and a Curio-like proving queue in virtual time.

It stands in for vast.ai and Curio so the controller can be run, replayed and tested without
either: `Simulation(config, seed).provider` is a Provider and a DemandSensor. No network, no
wall clock; all randomness comes from one seeded `random.Random`.
"""

from controller.sim.config import SimConfig
from controller.sim.simulation import Simulation

__all__ = ["SimConfig", "Simulation"]
