"""What rules could not decide: situations, the LLM that may answer them, the people who may,
the channels that carry the messages, and the answers that come back.

Must not: act on the fleet or bypass the guards (an answer is a proposal that goes through
`controller.core.guards` like any other); import `controller.service`, `controller.sim`,
`controller.tools`, `controller.fleet` (bar its shared HTTP retry) or the rule engine.
"""
