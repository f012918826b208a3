"""The operator's rules files: load and validate them (file:line errors), compile them, bound
their expressions, run their tests, and turn firings into proposals.

Must not: touch the network or a database; import `store`, `fleet`, `service`, `sim`, `tools`
or `escalation`. Only `controller.rules.engine` imports durable_rules.
"""
