"""`fleetgate simulate`: the controller against a replayed trace, beside the baselines.

Layers, and what each must not do:

- `results`, `fifo`, `baselines`, `market`: pure. Data in, data out: no files, no clock, no
  logging, no controller. The baselines are what a static fleet, a KEDA/HPA-style scaler and
  the oracles (with and without stop and start, without task moves, on the market's own
  machines) would have done with the same tasks, boot time, price and slots.
- `in_world`: the KEDA/HPA-style scaler again, on the simulator fleetgate faces (same config,
  seed and tasks), acting through the world's own calls; no controller code.
- `run`: drives the real controller (`assemble`, `Controller.tick`) on the simulator in
  virtual time. It writes the journal and the task list under the report directory; it never
  decides anything itself.
- `operator`: an opt-in stand-in for the person who answers escalations, through the same
  `escalation.approvals` calls as `fleetgate escalations approve|deny`.
- `report`, `chart`: figures out of results; `report.json`, the console table and the PNG.
- `command`: the CLI options and the order of the steps.
"""
