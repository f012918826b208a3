"""The reference instance agent, shipped with the package and copied onto instance images.

`fleetgate_agent.py` is one file that needs only the Python standard library, so it runs on any
image with a python3; it must NOT import anything from `controller` (or any third-party package).
"""
