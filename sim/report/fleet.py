"""The summary's ``fleet`` section: replicas and routing, the prefill/decode hand-off of a
disaggregated fleet, and what the autoscaler did."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import numpy as np

from sim.fleet.autoscaler import Autoscaler
from sim.fleet.disagg import DisaggregatedFleet
from sim.fleet.pool import Fleet


def fleet_summary(
    fleet: Fleet | DisaggregatedFleet, scaler: Autoscaler | None, end_s: float
) -> dict[str, Any] | None:
    """The ``fleet`` section, or None for one replica without an autoscaler (a disaggregated
    fleet always has two replicas or more)."""
    replicas = fleet.replicas
    if len(replicas) <= 1 and scaler is None:
        return None
    section: dict[str, Any] = {
        "replicas": len(replicas),
        "router": fleet.router.policy,
        "router_affinity_hits": fleet.router.num_affinity_hits,
        "router_hash_placements": fleet.router.num_hash_placements,
        "router_overflows": fleet.router.num_overflows,
        "per_replica": fleet.replica_summary(end_s),
    }
    if isinstance(fleet, DisaggregatedFleet):
        transfers = np.asarray(fleet.transfer_s, dtype=np.float64)
        section["disaggregation"] = {
            "prefill_replicas": len(fleet.prefill.replicas),
            "decode_replicas": len(fleet.decode.replicas),
            "kv_transfers": int(transfers.size),
            "kv_transfer_s_mean": float(transfers.mean()) if transfers.size else None,
            "kv_transfer_s_p99": float(np.percentile(transfers, 99)) if transfers.size else None,
        }
    if scaler is not None:
        section["autoscaling"] = {
            "metric": scaler.config.metric,
            "target": scaler.config.target,
            "startup_s": scaler.config.startup_s,
            "max_replicas_reached": fleet.series.peak_replicas,
            "events": [asdict(event) for event in scaler.events],
        }
    return section
