"""`fleetgate bench`: tick cost on the simulator (`sim`), per phase at scale (`tick`, `world`),
and a soak for memory (`soak`)."""
