"""Fakes that behave: real local servers speaking the protocols fleetgate talks to."""
