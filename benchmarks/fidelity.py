"""Fidelity: calibrate on a live vLLM server, then predict workloads the calibration never saw.

The whole loop on one machine: start vLLM (the tiny local model on the CPU backend by default,
or ``--model DIR`` for another local model), calibrate within a time budget, estimate the
server's capacity with the calibrated simulator (a saturating burst), refit that profile to the
records of one loaded run (Poisson at 50% of capacity, its own seed: ``calibrate --records``),
then for held-out workloads — Poisson at 30%, 60% and 85% of that capacity, a Gamma-bursty one, a
multi-turn one with a shared system prompt — simulate with both profiles and run live, and print
the errors of both side by side.

Run: ``.venv/bin/python benchmarks/fidelity.py [--budget 90s] [--requests 100] [--model DIR]``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from calibration.fit import fit_steps
from calibration.measure_plan import MeasurementPlan, parse_budget
from calibration.measure_runner import measure
from calibration.profile import fitted_profile
from calibration.records import fit_scenario_to_records
from calibration.validate import ServerSide, compare
from live.replay import Target
from live.run import run_live
from live.server import VLLMServer
from live.tiny_model import ensure_tiny_model
from live.tokens import PromptTokens
from sim.engine.profile import EngineInfo
from sim.run import build
from sim.scenario import EngineSpec, Scenario, parse_scenario

ENGINE = EngineSpec(block_size=32, max_num_seqs=32, max_num_batched_tokens=2048, max_model_len=2048)


def scenario(workload: dict[str, Any], profile: Path | None, seed: int) -> Scenario:
    data: dict[str, Any] = {
        "name": "fidelity",
        "seed": seed,
        "model": "servesim-tiny-llama",
        "gpu": {
            "name": "cpu-core",
            "memory_gb": 4,
            "memory_bandwidth_tb_s": 0.02,
            "bf16_tflops": 0.1,
        },
        "engine": ENGINE.model_dump(),
        "workload": workload,
    }
    if profile is not None:
        data["latency"] = {"profile": str(profile)}
    return parse_scenario(data)


LENGTHS = {
    "prompt_tokens": {"type": "uniform", "low": 100, "high": 800},
    "output_tokens": {"type": "uniform", "low": 8, "high": 64},
}


def capacity_rps(profile: Path) -> float:
    """Requests per second the calibrated simulator sustains under a saturating burst."""
    burst = {"arrival": {"type": "poisson", "rate": 1000.0}, **LENGTHS, "num_requests": 300}
    summary = build(scenario(burst, profile, seed=1)).run().summary
    return float(summary["throughput"]["requests_per_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="90s", help="calibration time budget")
    parser.add_argument("--requests", type=int, default=100, help="requests per workload")
    parser.add_argument("--model", default=None, help="local model directory (default: tiny)")
    parser.add_argument(
        "--max-simulations", type=int, default=60, help="budget of the records refit"
    )
    args = parser.parse_args()
    model_dir = Path(args.model) if args.model else ensure_tiny_model()
    vocab = int(json.loads((model_dir / "config.json").read_text())["vocab_size"])
    tokens = PromptTokens(vocab)
    work = Path(tempfile.mkdtemp(prefix="servesim-fidelity-"))
    with VLLMServer(str(model_dir), ENGINE, log_path=work / "server.log") as server:
        budget_s = parse_budget(args.budget)
        plan = MeasurementPlan.for_budget(
            budget_s, max_model_len=2048, max_num_seqs=32, max_num_batched_tokens=2048
        )
        measurement = measure(
            server.url, server.model_name, tokens, plan, block_size=32, budget_s=budget_s
        )
        coefficients, report = fit_steps(measurement.observations)
        template = scenario(
            {"arrival": {"type": "poisson", "rate": 1}, **LENGTHS, "num_requests": 1}, None, 0
        )
        profile_path = fitted_profile(
            template, coefficients, report, engine=EngineInfo(name="vllm")
        ).save(work / "profile.json")
        capacity = capacity_rps(profile_path)
        n = args.requests
        # The load calibration: one Poisson run at half the capacity, then a records fit
        # starting from the idle profile.
        training = scenario(
            {
                **LENGTHS,
                "arrival": {"type": "poisson", "rate": 0.5 * capacity},
                "prefix": {"type": "shared", "num_groups": 2, "prefix_tokens": 512, "share": 0.8},
                "num_requests": n,
            },
            profile_path,
            seed=99,
        )
        trained = run_live(
            training, Target(server.url, server.model_name), tokens, out_dir=work / "training"
        )
        loaded_coefficients, loaded_report, _ = fit_scenario_to_records(
            training, trained.records, coefficients, max_evaluations=args.max_simulations
        )
        loaded_path = fitted_profile(
            template, loaded_coefficients, loaded_report, engine=EngineInfo(name="vllm")
        ).save(work / "profile-loaded.json")
        shared = {"type": "shared", "num_groups": 2, "prefix_tokens": 512, "share": 0.8}
        workloads = {
            "poisson 30%": {"arrival": {"type": "poisson", "rate": 0.3 * capacity}},
            "poisson 60%": {"arrival": {"type": "poisson", "rate": 0.6 * capacity}},
            "poisson 85%": {"arrival": {"type": "poisson", "rate": 0.85 * capacity}},
            "gamma cv3 60%": {"arrival": {"type": "gamma", "rate": 0.6 * capacity, "cv": 3}},
            "multi-turn": {
                "arrival": {"type": "poisson", "rate": 0.1 * capacity},
                "prefix": {
                    "type": "multi_turn",
                    "turns": {"type": "uniform", "low": 2, "high": 5},
                    "think_time_s": 1.0,
                    "system_prompt_tokens": 256,
                },
            },
        }
        print(
            f"calibration: {len(measurement.observations)} points in "
            f"{measurement.duration_s:.0f} s, fit error mean {report.relative_error_mean:.1%}; "
            f"capacity ≈ {capacity:.2f} req/s; records refit at 50% load: error mean "
            f"{loaded_report.relative_error_mean:.1%}"
        )
        print(f"idle:   {json.dumps(asdict(coefficients))}")
        print(f"loaded: {json.dumps(asdict(loaded_coefficients))}")
        header = (
            "workload",
            "profile",
            "TTFT mean",
            "TTFT p90",
            "srv TTFT mean",
            "TPOT mean",
            "TPOT p90",
            "hit pts",
        )
        print("".join(f"{h:>14}" for h in header))
        for seed, (name, arrival) in enumerate(workloads.items(), start=10):
            workload = {**LENGTHS, **arrival, "num_requests": n}
            if "prefix" not in workload:
                workload["prefix"] = shared
            held_out = scenario(workload, profile_path, seed)
            result = run_live(
                held_out, Target(server.url, server.model_name), tokens, out_dir=work / name
            )
            result.write(work / name)
            live = result.summary
            for label, path, front in (
                ("idle", profile_path, coefficients.frontend_overhead_s),
                ("loaded", loaded_path, loaded_coefficients.frontend_overhead_s),
            ):
                simulated = build(scenario(workload, path, seed)).run().summary
                server_side = (
                    ServerSide.from_metrics(result.metrics, front) if result.metrics else None
                )
                errors = {r["metric"]: r for r in compare(live, simulated, server=server_side).rows}
                cells = [
                    errors[m]["rel_error"] if m in errors else float("nan")
                    for m in (
                        "ttft_s mean",
                        "ttft_s p90",
                        "server ttft_s mean",
                        "tpot_s mean",
                        "tpot_s p90",
                    )
                ]
                hit = errors["prefix hit rate"]["abs_error"] * 100
                print(
                    f"{name:>14}{label:>14}"
                    + "".join(f"{c:>+14.1%}" for c in cells)
                    + f"{hit:>+14.1f}"
                )
    print(
        "(sim/live − 1; srv TTFT: vLLM's own TTFT histogram against the simulated TTFT less "
        f"the front-end overhead; outputs in {work})"
    )


if __name__ == "__main__":
    main()
