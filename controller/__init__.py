"""fleetgate's controller, in rooms by role. Each room's `__init__` says what it must not do,
and `tests/test_layers.py` checks it. Dependencies run one way:

    core  ←  rules  ←  store  ←  fleet  ←  sim  ←  service  ←  tools
     (pure)  (rules files,   (the      (the wire:   (a world     (the tick      (replay,
             durable_rules)  journal)  vast, Curio,  below the    pipeline,      benches)
                                       agents)       wire)        assembly, CLI)

`escalation/` (situations, the outbox, the LLM, channels) sits beside `service`, using `core`
and `store`.
"""
