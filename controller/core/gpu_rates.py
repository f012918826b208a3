"""The highest plausible proving rate (proofs an hour, per GPU) by GPU model.

An estimate, not a measurement: a 32 GiB PoRep C2 SNARK takes a few minutes on the fastest
current GPUs (roughly 4-10 min per proof with cuzk-style pipelining), so tens of proofs an hour
per GPU is real. Each bound below is about three times the best rate we expect of that model,
so a fast, honest host is never refused and a made-up benchmark is. Unknown models get the
global bound (the instance API's `MAX_RATE`). Rates scale with the instance's GPU count.
"""

from __future__ import annotations

GLOBAL_MAX_RATE = 1000.0  # proofs/hour, the instance API's ceiling for any self-report

# GPU model (as vast names it, lower case, without "NVIDIA"/"GeForce") -> proofs/hour per GPU
PLAUSIBLE_PER_GPU: dict[str, float] = {
    "rtx 3090": 30.0,
    "rtx 4090": 60.0,
    "rtx 5090": 90.0,
    "a100": 60.0,
    "h100": 120.0,
    "h200": 140.0,
}


def max_plausible(gpu_name: str, num_gpus: int = 1) -> float:
    """The highest rate believable of `num_gpus` GPUs of this model; unknown: the global bound."""
    name = " ".join(gpu_name.lower().replace("nvidia", "").replace("geforce", "").split())
    for model, per_gpu in sorted(PLAUSIBLE_PER_GPU.items(), key=lambda kv: -len(kv[0])):
        if name == model or name.startswith(model + " ") or name.startswith(model + "-"):
            return min(per_gpu * max(1, num_gpus), GLOBAL_MAX_RATE)
    return GLOBAL_MAX_RATE


def plausible(rate: float, gpu_name: str, num_gpus: int = 1) -> bool:
    return 0.0 <= rate <= max_plausible(gpu_name, num_gpus)
