"""What a run cost: GPU-hours and dollars, each replica billed for its lifetime."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sim.fleet.pool import FleetReplica


def cost_summary(
    replicas: Sequence[FleetReplica], end_s: float, output_tokens: int
) -> dict[str, Any]:
    """GPU-hours and dollars of a run: each replica billed from its start (start-up included)
    to when it stopped or the run ended, at its GPUs' price; None where a price is missing."""
    gpu_hours = 0.0
    total = 0.0
    missing: set[str] = set()
    by_gpu: dict[str, float] = {}
    for replica in replicas:
        hardware = replica.hardware
        stop = replica.stopped_s if replica.stopped_s is not None else end_s
        hours = max(0.0, stop - replica.started_s) / 3600 * hardware.num_gpus
        gpu_hours += hours
        by_gpu[hardware.gpu] = by_gpu.get(hardware.gpu, 0.0) + hours
        if hardware.gpu_hour_usd is None:
            missing.add(hardware.gpu)
        else:
            total += hours * hardware.gpu_hour_usd
    known = not missing
    return {
        "gpu_hours": gpu_hours,
        "gpu_hours_by_gpu": by_gpu,
        "total_usd": total if known else None,
        "usd_per_hour": total / (end_s / 3600) if known and end_s > 0 else None,
        "usd_per_million_output_tokens": (
            total / output_tokens * 1e6 if known and output_tokens else None
        ),
        "missing_prices": sorted(missing),
    }
