"""Measured step times: what calibration fits the iteration-time model to.

An :class:`Observation` says "a step computing ``batch`` took ``seconds``" — measured on a live
server (a lone prefill's TTFT, a steady decode batch's time per output token), or summed from
an operator timing table. Client-side measurements of TTFT also contain the server's front-end
overhead; ``includes_frontend`` says so, and the fit estimates that overhead as its own term.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from sim.engine.latency import BatchShape


@dataclass(frozen=True, slots=True)
class Observation:
    """One measured step (or the mean of repeated identical steps)."""

    batch: BatchShape
    seconds: float
    kind: str  # "prefill" | "decode" | "mixed" | "operator"
    includes_frontend: bool = False
    weight: float = 1.0
    repetitions: int = 1
    # Requests the server received while the step ran (a loaded step): each takes host time
    # from the step (CalibratedCoefficients.per_arrival_s).
    arrivals: float = 0.0

    def __post_init__(self) -> None:
        if not self.seconds > 0:
            raise ValueError(f"seconds: a measured step must take > 0 s, got {self.seconds}")


def observations_to_json(observations: list[Observation]) -> list[dict[str, object]]:
    """Observations as JSON-ready dicts (the batch shape's fields nested under ``batch``)."""
    return [{**asdict(obs), "batch": asdict(obs.batch)} for obs in observations]


def observations_from_json(entries: list[dict[str, Any]]) -> list[Observation]:
    """What :func:`observations_to_json` wrote, back as observations."""
    return [Observation(**{**entry, "batch": BatchShape(**entry["batch"])}) for entry in entries]
