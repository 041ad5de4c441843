"""Simulation speed on the reference scenarios of issue 7 (R1–R4).

For each scenario: simulated seconds per wall second, requests and engine steps per wall second,
and the process's peak RSS. Only the step-by-step engine exists so far (the fast-forward mode
that issue 7 asks for is not built), so there is one column of measurements, printed beside
the targets: R1 ≥ 1,000× real time, R2 under 60 s and 2 GB.

Run: ``.venv/bin/python benchmarks/speed.py [--full] [--scale 0.1]``. ``--full`` adds R2
(576,000 requests; several minutes). ``--scale`` shrinks every scenario's request count (the
ratios barely depend on it once there are a few thousand requests).
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path
from typing import Any

from sim.run import build
from sim.scenario import parse_scenario

SHARED = Path(__file__).parents[1].parent / "shared" / "data"

LENGTHS = {
    "prompt_tokens": {
        "type": "lognormal", "mu": 6.7828, "sigma": 0.5, "min_tokens": 1, "max_tokens": 8192,
    },
    "output_tokens": {
        "type": "lognormal", "mu": 5.3964, "sigma": 0.5, "min_tokens": 1, "max_tokens": 4096,
    },
}  # fmt: skip


def scenario(name: str, scale: float) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": name,
        "seed": 0,
        "model": "llama-3.1-8b",
        "gpu": "h100-sxm",
        "engine": {"max_model_len": 16384},
        "output": {"sample_interval_s": 10.0},
    }
    match name:
        case "R1":
            base["workload"] = {
                "arrival": {"type": "poisson", "rate": 10},
                **LENGTHS,
                "num_requests": int(36_000 * scale),
            }
        case "R2":
            base["fleet"] = {"replicas": 16}
            base["workload"] = {
                "arrival": {"type": "poisson", "rate": 160},
                **LENGTHS,
                "num_requests": int(576_000 * scale),
            }
        case "R3":
            base["fleet"] = {"replicas": 8, "router": {"policy": "prefix_affinity"}}
            base["workload"] = {
                "arrival": {"type": "poisson", "rate": 8},
                **LENGTHS,
                "prefix": {
                    "type": "multi_turn",
                    "turns": {"type": "uniform", "low": 2, "high": 6},
                    "think_time_s": 10,
                    "system_prompt_tokens": 1000,
                },
                "duration_s": 3600 * scale,
            }
        case "R4":
            # The Azure conversation trace (~5.6 req/s of ~1k-token prompts and ~230-token
            # answers over an hour) on 2 replicas loads each to roughly 70 %.
            base["fleet"] = {"replicas": 2, "router": {"policy": "least_outstanding"}}
            base["workload"] = {
                "trace": {
                    "path": str(SHARED / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv")
                },
                "num_requests": int(19_366 * scale),
            }
    return base


def measure(name: str, scale: float) -> dict[str, float]:
    simulation = build(parse_scenario(scenario(name, scale)))
    started = time.perf_counter()
    result = simulation.run()
    wall = time.perf_counter() - started
    fleet = simulation.fleet
    steps = sum(r.num_steps for r in fleet.replicas) if fleet is not None else 0
    return {
        "requests": len(result.records),
        "wall_s": wall,
        "sim_per_wall": result.summary["sim"]["simulated_s"] / wall,
        "requests_per_s": len(result.records) / wall,
        "steps_per_s": steps / wall,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="also run R2 (576k requests)")
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of each workload")
    args = parser.parse_args()
    names = ["R1", "R3", "R4"] + (["R2"] if args.full else [])
    header = ("scenario", "requests", "wall s", "sim s/wall s", "req/s", "steps/s", "peak RSS GB")
    print("".join(f"{h:>14}" for h in header))
    for name in names:
        m = measure(name, args.scale)
        print(
            f"{name:>14}{m['requests']:>14,.0f}{m['wall_s']:>14.1f}{m['sim_per_wall']:>14.0f}"
            f"{m['requests_per_s']:>14,.0f}{m['steps_per_s']:>14,.0f}{m['peak_rss_gb']:>14.2f}"
        )
    print("targets: R1 >= 1,000x real time; R2 < 60 s wall and < 2 GB (step-by-step mode only)")


if __name__ == "__main__":
    main()
