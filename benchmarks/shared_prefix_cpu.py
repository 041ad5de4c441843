"""Shared prefixes on the CPU backend: does pricing shared KV apart fix the TPOT the old
profile overestimated?

One vLLM-CPU server (the ~85M random Llama by default: hidden 768, 12 layers, vocabulary 1024),
one calibration that includes decode batches sharing a prefix, then one held-out workload
where every request starts with the same long system prompt and many decode at once. The
workload is simulated twice with the same profile: as fitted (shared KV priced by its own
coefficient), and with that coefficient set to the per-context one (what every profile did
before the term existed). Prints sim/live − 1 for both, side by side, ``--repeats`` times.

Run: ``.venv/bin/python benchmarks/shared_prefix_cpu.py [--model DIR] [--requests 40]``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import asdict, replace
from pathlib import Path

from fidelity import ENGINE, MODEL_85M, scenario  # the same CPU server, model and scenario

from calibration.fit import fit_steps
from calibration.measure_plan import MeasurementPlan
from calibration.measure_runner import measure
from calibration.profile import fitted_profile
from calibration.validate import compare
from live.replay import Target
from live.run import run_live
from live.server import VLLMServer
from live.tiny_model import ensure_tiny_model
from live.tokens import PromptTokens
from sim.engine.profile import EngineInfo
from sim.run import build

METRICS = ("ttft_s mean", "ttft_s p90", "tpot_s mean", "tpot_s p90", "e2e_s mean")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="local model directory (default: ~85M)")
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--rate", type=float, default=1.0, help="req/s of the held-out load")
    parser.add_argument("--repeats", type=int, default=2, help="live runs of the held-out load")
    args = parser.parse_args()
    model_dir = Path(args.model) if args.model else ensure_tiny_model(MODEL_85M)
    vocab = int(json.loads((model_dir / "config.json").read_text())["vocab_size"])
    tokens = PromptTokens(vocab)
    work = Path(tempfile.mkdtemp(prefix="servesim-shared-"))
    plan = MeasurementPlan(
        prefill_lengths=(32, 256, 1024),
        decode_batches=(1, 8, 16),
        decode_contexts=(64, 512, 1024),
        decode_tokens=16,
        mixed=False,
        repetitions=1,
        max_model_len=2048,
        max_num_seqs=32,
        max_num_batched_tokens=2048,
    )
    workload = {
        "arrival": {"type": "poisson", "rate": args.rate},
        "prompt_tokens": {"type": "uniform", "low": 928, "high": 1024},
        "output_tokens": {"type": "constant", "value": 32},
        "prefix": {"type": "shared", "num_groups": 1, "prefix_tokens": 896, "share": 1.0},
        "num_requests": args.requests,
    }
    with VLLMServer(str(model_dir), ENGINE, log_path=work / "server.log") as server:
        measurement = measure(
            server.url, server.model_name, tokens, plan, block_size=32, budget_s=900
        )
        coefficients, report = fit_steps(measurement.observations)
        template = scenario(workload, None, seed=0)
        fitted = fitted_profile(template, coefficients, report, engine=EngineInfo(name="vllm"))
        shared_path = fitted.save(work / "profile.json")
        flat = replace(coefficients, per_shared_context_token_s=coefficients.per_context_token_s)
        flat_path = fitted.model_copy(update={"coefficients": flat}).save(work / "flat.json")
        print(
            f"calibration: {len(measurement.observations)} points, fit error mean "
            f"{report.relative_error_mean:.1%}; {json.dumps(asdict(coefficients))}"
        )
        print(f"{'run':>5}{'profile':>10}" + "".join(f"{m:>14}" for m in METRICS))
        for repeat in range(args.repeats):
            held_out = scenario(workload, shared_path, seed=repeat)
            live = run_live(
                held_out, Target(server.url, server.model_name), tokens, out_dir=work / str(repeat)
            ).summary
            for label, path in (("shared", shared_path), ("flat", flat_path)):
                simulated = build(scenario(workload, path, seed=repeat)).run().summary
                rows = {r["metric"]: r for r in compare(live, simulated).rows}
                cells = "".join(
                    f"{rows[m]['rel_error']:>+14.1%}" if m in rows else f"{'-':>14}"
                    for m in METRICS
                )
                print(f"{repeat:>5}{label:>10}{cells}")
    print(f"(sim/live − 1; outputs in {work})")


if __name__ == "__main__":
    main()
