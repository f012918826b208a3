"""The running service: the tick pipeline, the schedule, the composition root that builds a
controller from a config, the operator HTTP API and the CLI.

Must not: import durable_rules (only `controller.rules.engine` does), or the tools (replay,
benches), except the CLI, which is the front door to both.
"""
