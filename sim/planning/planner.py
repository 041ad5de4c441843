"""Capacity planning: the cheapest configuration that meets the SLOs at a given load.

A :class:`Candidate` is one way to deploy the scenario's model — GPU type, tensor parallelism,
weight dtype, replica count. :func:`evaluate` simulates the scenario's traffic on it and
reports whether the SLOs were met and what it costs per hour; :func:`search` evaluates a grid
(in parallel processes), and :func:`pareto_front` and :func:`breaking_load` (a bisection on the
arrival rate) describe the trade-off. Candidates that cannot run (the model does not fit, no
price for the GPU) are reported with the reason, not dropped silently.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from sim.catalog.hardware import dtype_spelling
from sim.catalog.model_names import checkpoint_quantization
from sim.catalog.models import get_model
from sim.planning.parallel import run_all
from sim.run import summary_or_error


@dataclass(frozen=True)
class Candidate:
    """A deployment: ``replicas`` co-located replicas, or with ``prefill`` > 0 a disaggregated
    fleet of ``prefill`` prefill and ``replicas`` decode replicas."""

    gpu: str
    tensor_parallel_size: int
    dtype: str
    replicas: int
    prefill: int = 0

    @property
    def label(self) -> str:
        shape = f"{self.prefill}P:{self.replicas}D" if self.prefill else f"{self.replicas}×"
        return f"{shape} {self.gpu} TP{self.tensor_parallel_size} {self.dtype}"


@dataclass(frozen=True)
class Evaluation:
    """One candidate's outcome under the scenario's traffic."""

    candidate: Candidate
    feasible: bool  # it ran (fits, has a price)
    meets_slo: bool
    usd_per_hour: float | None
    ttft_at_percentile_s: float | None
    tpot_at_percentile_s: float | None
    slo_attainment: float | None
    output_tokens_per_s: float | None
    reason: str = ""
    e2e_at_percentile_s: float | None = None
    autoscaled: bool = False  # replicas is the HPA's max_replicas; the cost is what it used

    def row(self) -> dict[str, Any]:
        return {
            **asdict(self.candidate),
            "label": self.candidate.label,
            **{k: v for k, v in asdict(self).items() if k != "candidate"},
        }


def apply(data: dict[str, Any], candidate: Candidate) -> dict[str, Any]:
    """The scenario dict with the candidate's GPU, TP, dtype and replica count.

    A scenario with an autoscaler keeps it on co-located candidates: ``replicas`` is then the
    HPA's ``max_replicas`` (its ``min_replicas`` lowered to fit), so the plan prices what the
    HPA would run, not a fixed fleet. Disaggregated candidates are fixed pools (the HPA scales
    one pool).
    """
    out = copy.deepcopy(data)
    out["gpu"] = candidate.gpu
    model = out.get("model")
    quantized = checkpoint_quantization(model) if isinstance(model, str) else None
    # vLLM's spellings as the scenario reads them; auto: the named checkpoint's own weights.
    dtype = dtype_spelling(candidate.dtype)
    if dtype == "auto":
        dtype = quantized.dtype if quantized is not None else "bf16"
    out["dtype"] = dtype
    if quantized is not None and quantized.dtype != dtype:
        # Other weights than the named checkpoint's: the model it quantizes, at the candidate's.
        out["model"] = get_model(str(model)).name
        if out.get("quantization") == quantized.quantization:
            del out["quantization"]
    out.setdefault("engine", {})["tensor_parallel_size"] = candidate.tensor_parallel_size
    fleet = out.setdefault("fleet", {})
    autoscaling = fleet.pop("autoscaling", None)
    fleet.pop("pools", None)
    fleet.pop("disaggregation", None)
    fleet["replicas"] = candidate.replicas
    if autoscaling and not candidate.prefill:
        floor = min(int(autoscaling.get("min_replicas", 1)), candidate.replicas)
        fleet["autoscaling"] = {**autoscaling, "min_replicas": floor}
        fleet["autoscaling"]["max_replicas"] = candidate.replicas
        start = int(data.get("fleet", {}).get("replicas", floor))
        fleet["replicas"] = max(floor, min(start, candidate.replicas))
    if candidate.prefill:
        fleet["disaggregation"] = {
            **(data.get("fleet", {}).get("disaggregation") or {}),
            "prefill": {"replicas": candidate.prefill},
            "decode": {"replicas": candidate.replicas},
        }
    return out


def evaluate(data: dict[str, Any], candidate: Candidate) -> Evaluation:
    """Simulate the scenario's traffic on ``candidate`` (a top-level function: it runs in
    worker processes)."""
    deployed = apply(data, candidate)
    summary, error = summary_or_error(deployed, candidate.label)
    if error:
        return _infeasible(candidate, error)
    slo = summary["slo"]
    usd = summary["cost"]["usd_per_hour"]
    if usd is None:
        return _infeasible(
            candidate, f"no price for {', '.join(summary['cost']['missing_prices'])}"
        )
    return Evaluation(
        candidate,
        feasible=True,
        meets_slo=bool(slo["met"]),
        usd_per_hour=usd,
        ttft_at_percentile_s=slo["ttft_at_percentile_s"],
        tpot_at_percentile_s=slo["tpot_at_percentile_s"],
        slo_attainment=summary["goodput"]["slo_attainment"],
        output_tokens_per_s=summary["throughput"]["output_tokens_per_s"],
        e2e_at_percentile_s=slo.get("e2e_at_percentile_s"),
        autoscaled="autoscaling" in deployed["fleet"],
    )


def _infeasible(candidate: Candidate, reason: str) -> Evaluation:
    return Evaluation(candidate, False, False, None, None, None, None, None, reason)


def grid(
    gpus: Sequence[str],
    tensor_parallel_sizes: Sequence[int],
    dtypes: Sequence[str],
    replicas: Sequence[int],
    *,
    disaggregated: bool = False,
) -> list[Candidate]:
    """Every combination; with ``disaggregated`` also every xP:yD split of each replica count
    of 2 or more (x + y replicas in all)."""
    out = []
    for gpu, tp, dtype, n in itertools.product(gpus, tensor_parallel_sizes, dtypes, replicas):
        out.append(Candidate(gpu, tp, dtype, n))
        if disaggregated:
            out += [Candidate(gpu, tp, dtype, n - p, prefill=p) for p in range(1, n)]
    return out


def search(
    data: dict[str, Any],
    candidates: Iterable[Candidate],
    *,
    workers: int = 2,
    progress: Callable[[int, int], None] | None = None,
) -> list[Evaluation]:
    """Evaluate every candidate, ``workers`` at a time (1: in this process), in the candidates'
    order; ``progress(done, total)`` after each evaluation."""
    return run_all(evaluate, data, list(candidates), workers=workers, progress=progress)


def cheapest(evaluations: Iterable[Evaluation]) -> Evaluation | None:
    """The lowest-cost candidate that meets the SLOs (ties: fewer GPUs, then lower TTFT)."""
    passing = [e for e in evaluations if e.meets_slo and e.usd_per_hour is not None]
    if not passing:
        return None
    return min(
        passing,
        key=lambda e: (
            e.usd_per_hour,
            (e.candidate.replicas + e.candidate.prefill) * e.candidate.tensor_parallel_size,
            e.ttft_at_percentile_s or math.inf,
        ),
    )


def pareto_front(evaluations: Iterable[Evaluation]) -> list[Evaluation]:
    """Feasible candidates not beaten on both cost and TTFT at the SLO percentile, by cost."""
    feasible = sorted(
        (e for e in evaluations if e.feasible and e.ttft_at_percentile_s is not None),
        key=lambda e: (e.usd_per_hour or math.inf, e.ttft_at_percentile_s or math.inf),
    )
    front: list[Evaluation] = []
    best = math.inf
    for evaluation in feasible:
        ttft = evaluation.ttft_at_percentile_s or math.inf
        if ttft < best:
            front.append(evaluation)
            best = ttft
    return front


def breaking_load(
    data: dict[str, Any], candidate: Candidate, *, steps: int = 6, max_scale: float = 64.0
) -> float | None:
    """The largest multiple of the scenario's arrival rate at which ``candidate`` still meets
    the SLOs, by bisection over ``steps`` simulations (None: it fails at 1/max_scale already)."""
    arrival = data["workload"].get("arrival", {})
    if "rate" not in arrival:
        raise ValueError("workload.arrival: breaking load needs an arrival with a rate")
    if math.isinf(float(arrival["rate"])):
        raise ValueError(
            "workload.arrival.rate: an infinite rate has no multiple to search; breaking load "
            "needs a finite rate (or search workload.max_concurrency in a sweep)"
        )

    def meets(scale: float) -> bool:
        scaled = copy.deepcopy(data)
        scaled["workload"]["arrival"]["rate"] = arrival["rate"] * scale
        return evaluate(scaled, candidate).meets_slo

    low, high = 1.0 / max_scale, max_scale
    if not meets(low):
        return None
    if meets(high):
        return high
    for _ in range(steps):
        middle = math.sqrt(low * high)  # bisect in log space: loads span orders of magnitude
        if meets(middle):
            low = middle
        else:
            high = middle
    return low


def plan_document(
    name: str,
    data: dict[str, Any],
    evaluations: Sequence[Evaluation],
    front: Sequence[Evaluation],
    breaks: dict[str, float | None],
    best: Evaluation | None,
) -> dict[str, Any]:
    """The plan as one JSON-able document: the SLOs and load it was made for, every candidate
    (with ``pareto`` and ``breaks_above_x_load``), and the cheapest one meeting the SLOs."""
    on_front = {e.candidate for e in front}

    def finite(row: dict[str, Any]) -> dict[str, Any]:  # JSON has no NaN: unknown is null
        return {
            k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in row.items()
        }

    arrival = data.get("workload", {}).get("arrival") or {}
    rate = arrival.get("rate")
    return {
        "scenario": name,
        "slo": data.get("slo", {}),
        "rate_rps": None if rate is None or not math.isfinite(rate) else rate,
        "autoscaling": bool(data.get("fleet", {}).get("autoscaling")),
        "cheapest": None if best is None else finite(best.row()),
        "candidates": [
            {
                **finite(e.row()),
                "pareto": e.candidate in on_front,
                "breaks_above_x_load": breaks.get(e.candidate.label),
            }
            for e in evaluations
        ],
    }


def write_plan(document: dict[str, Any], out_dir: Path) -> list[Path]:
    """``plan.json`` (the document) and ``candidates.csv`` (one row per candidate) in
    ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    plan_path = out_dir / "plan.json"
    plan_path.write_text(json.dumps(document, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    table_path = out_dir / "candidates.csv"
    pd.DataFrame(document["candidates"]).to_csv(table_path, index=False)
    return [plan_path, table_path]
