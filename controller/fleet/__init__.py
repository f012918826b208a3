"""The wire to the fleet: vast.ai's API, Curio's task tables, cuzk's status probes, the instance
API and what agents report, the reference agent, and the actuator.

Must not: decide (import `core.decide`, `core.guards` or `rules`), import `service`, `sim`,
`tools` or `escalation`. Sensors (`curio`, `health`) return observations and never act.
The agent (`fleet.agent`) imports nothing from the project at all.
"""
