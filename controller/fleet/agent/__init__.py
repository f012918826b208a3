"""The reference instance agent, shipped with the package and copied onto instance images.

A small package that needs only the Python standard library, so it runs on any image with a
python3: `fleetgate_agent.py` is the command line (the `fleetgate-agent` console script, or
`python3 fleetgate_agent.py` in a copy of this folder), `client` talks to the instance API,
`heartbeat` reports the daemon and runs the controller's commands, `push_logs` tails a log.
Its modules import only each other (relatively) and the standard library; they must NOT import
anything from `controller` (or any third-party package).
"""
