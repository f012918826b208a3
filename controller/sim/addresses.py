"""Where a simulated instance is reachable, as vast lists it and as its Curio node announces it.

Pure and stateless: every number is derived from ids, so the vast wire, the Curio rows and the
health probes agree without sharing state, and a world restored from JSON keeps its addresses.
Addresses are in TEST-NET-2 (RFC 5737), then the shared range of RFC 6598: nothing ever
connects to them, the simulator answers every probe itself.

    vast machine id    1000 + n       for the simulator's machine "m<n>"
    vast host id       2000 + n       for its host "h<n>"
    public address     198.51.100.x (then 100.64.0.0/10), one per machine
    status port        public port mapped to cuzk's 9821, per instance
    Curio port         public port mapped to Curio's 12300, per instance
    Curio machine id   the instance id (operator nodes are 1, 2, ...)
"""

from __future__ import annotations

STATUS_PORT = 9821  # cuzk's status server inside the container
CURIO_PORT = 12300  # Curio's listen port inside the container
MACHINE_BASE = 1000
HOST_BASE = 2000


def _index(sim_id: str) -> int:
    """n of "m<n>" / "h<n>"; a plain number stays itself."""
    digits = sim_id.lstrip("mh")
    return int(digits) if digits.isdigit() else abs(hash(sim_id)) % 100_000


def vast_machine_id(sim_machine_id: str) -> int:
    return MACHINE_BASE + _index(sim_machine_id)


def sim_machine_id(vast_id: int | str) -> str:
    """The simulator's machine id for vast's machine id (inverse of `vast_machine_id`)."""
    return f"m{int(vast_id) - MACHINE_BASE:03d}"


def vast_host_id(sim_host_id: str) -> int:
    return HOST_BASE + _index(sim_host_id)


def public_ip(sim_machine_id: str) -> str:
    n = _index(sim_machine_id)
    if n < 254:
        return f"198.51.100.{n + 1}"
    n -= 254  # a large simulated market: the shared address space (RFC 6598), never routed here
    return f"100.{64 + n // 65536 % 64}.{n // 256 % 256}.{n % 256}"


def status_port(instance_id: str) -> int:
    return 40000 + int(instance_id) % 10000


def curio_port(instance_id: str) -> int:
    return 50000 + int(instance_id) % 10000


def ports(instance_id: str) -> dict[str, list[dict[str, str]]]:
    """vast's `ports` field: internal port/proto -> public bindings."""
    return {
        f"{STATUS_PORT}/tcp": [{"HostIp": "0.0.0.0", "HostPort": str(status_port(instance_id))}],
        f"{CURIO_PORT}/tcp": [{"HostIp": "0.0.0.0", "HostPort": str(curio_port(instance_id))}],
    }


def curio_node(instance_id: str, sim_machine_id: str) -> str:
    """The host_and_port an instance's Curio node writes into harmony_machines."""
    return f"{public_ip(sim_machine_id)}:{curio_port(instance_id)}"


def operator_node(n: int) -> str:
    """The operator's own Curio node n (1-based): not a rented instance."""
    return f"10.0.0.{n}:12300"
