"""Fidelity on CPU: calibrate on a live vLLM server, then predict workloads it never saw.

The whole loop on one machine, on the ~85M random Llama (hidden 768, 12 layers, vocabulary 1024,
written by ``live/tiny_model.py``) on vLLM's CPU backend, or ``--model DIR``:

1. calibrate within ``--budget`` (the isolated points: prefill, decode grid, shared decode);
2. measure the server's capacity **live** (a saturating burst: completed requests over the
   burst's makespan), and the simulator's estimate of the same burst beside it; once for the
   common lengths and once for the shared-prompt shape's requests, whose longer decodes the
   server takes fewer of;
3. refit the profile to the records of one loaded training run (Poisson at 50% of the measured
   capacity, its own seed, replayed at its send times: ``calibrate --records``): "loaded";
4. the default calibration, what ``servesim calibrate`` adds to the isolated points: loaded
   replays of the common lengths (a burst, Poisson at 50% and 85% of what the burst measured)
   within ``--loaded-budget``, their rebuilt steps fitted with the isolated points: "default";
5. five held-out shapes sized from the measured capacities: Poisson at 30% and 90%, Gamma-bursty
   (CV 3) at 60%, a long shared system prompt with many sequences decoding at once, and
   multi-turn sessions; each run live ``--repeats`` times with the same requests (so the
   spread is the server's, not the workload's) and simulated with the three profiles. Each
   repeat's prompts carry their own salt: the same structure, other token ids, so a repeat
   does not hit what the one before left in the prefix cache.

Prints sim/live − 1 per shape and metric (TTFT, TPOT, E2E mean and p90): the mean over the
repeats and its range, the live run-to-run spread ((max − min) / mean of the live value), and
whether the error meets the target (|error| ≤ 10%, or within the spread where that is larger).

Right after the calibration and again before each live repeat, a *drift probe* re-measures two
calibration points (one decode of one sequence, one 128-token prefill; a few seconds). Each
repeat's drift is its probe against the first one: how much slower (+) or faster (−) the server
has become since it was calibrated. On a shared 2-core VM the same point moved by 40% within an
hour, and an error that follows the drift is the machine's, not the model's. The drift is
printed beside each shape's errors, never applied to them.
Everything lands in ``--out``; ``--rescore DIR`` reads a finished run's live results and profiles
back and simulates again (to score a model change without the hour of live runs).

Run: ``.venv/bin/python benchmarks/fidelity.py [--budget 8m] [--repeats 3] [--seconds 120]``
(about 45 minutes on 2 cores; ``--shapes multi-turn`` runs only the shapes named).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from calibration.fit import fit_steps, predict_seconds
from calibration.loaded import fit_loaded, live_runner, replays_from_summary, run_loaded
from calibration.measure_plan import MeasurementPlan, parse_budget
from calibration.measure_runner import measure
from calibration.observations import Observation, observations_from_json, observations_to_json
from calibration.profile import fitted_profile
from calibration.records import fit_scenario_to_records, read_records
from calibration.replay_fit import completed_rate
from live.replay import Target
from live.run import run_live
from live.server import VLLMServer
from live.tiny_model import TinyModelSpec, ensure_tiny_model
from live.tokens import PromptTokens
from sim.engine.coefficients import CalibratedCoefficients
from sim.engine.profile import EngineInfo, load_profile
from sim.run import build
from sim.scenario import EngineSpec, Scenario, parse_scenario

ENGINE = EngineSpec(block_size=32, max_num_seqs=32, max_num_batched_tokens=2048, max_model_len=2048)
MODEL_85M = TinyModelSpec(
    hidden_size=768,
    intermediate_size=2048,
    num_layers=12,
    num_heads=12,
    num_kv_heads=12,
    vocab_size=1024,
)
LENGTHS = {
    "prompt_tokens": {"type": "uniform", "low": 64, "high": 512},
    "output_tokens": {"type": "uniform", "low": 16, "high": 96},
}
METRICS = (
    ("ttft_s", "mean"),
    ("ttft_s", "p90"),
    ("tpot_s", "mean"),
    ("tpot_s", "p90"),
    ("e2e_s", "mean"),
    ("e2e_s", "p90"),
)
TARGET = 0.10
PROFILES = ("idle", "loaded", "default")
#: The drift probe: one prefill and one single-sequence decode, as the calibration measures them.
PROBE = MeasurementPlan(
    prefill_lengths=(128,),
    decode_batches=(1,),
    decode_contexts=(256,),
    decode_tokens=48,
    mixed=False,
    shared_prefix=False,
    cached_prefill=False,
    repetitions=3,
    max_model_len=2048,
    max_num_seqs=32,
    max_num_batched_tokens=2048,
)


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


#: The shared-prompt shape's requests: a 768-token system prompt every request shares, then
#: 64–256 tokens of its own. Its decodes run over ~3× the context of LENGTHS, so the server takes
#: fewer of them per second: its rate is set from its own measured capacity.
SHARED = {
    "prompt_tokens": {"type": "uniform", "low": 832, "high": 1024},
    "output_tokens": {"type": "uniform", "low": 32, "high": 96},
    "prefix": {"type": "shared", "num_groups": 1, "prefix_tokens": 768, "share": 1.0},
}


def shapes(capacity: float, shared_capacity: float, seconds: float) -> dict[str, dict[str, Any]]:
    """The held-out workloads, each about ``seconds`` long at its offered rate: ``capacity`` is
    the measured capacity for LENGTHS, ``shared_capacity`` the one for SHARED."""

    def sized(rate: float, requests_per_arrival: float = 1.0) -> int:
        return int(np.clip(round(rate * requests_per_arrival * seconds), 24, 120))

    light, heavy, bursty = 0.3 * capacity, 0.9 * capacity, 0.6 * capacity
    shared_rate = 0.8 * shared_capacity
    sessions = 0.15 * capacity  # 3.5 turns each on average: ~50% of capacity in requests
    return {
        "poisson 30%": {
            **LENGTHS,
            "arrival": {"type": "poisson", "rate": light},
            "num_requests": sized(light),
        },
        "poisson 90%": {
            **LENGTHS,
            "arrival": {"type": "poisson", "rate": heavy},
            "num_requests": sized(heavy),
        },
        "gamma cv3 60%": {
            **LENGTHS,
            "arrival": {"type": "gamma", "rate": bursty, "cv": 3},
            "num_requests": sized(bursty),
        },
        "shared prompt": {
            **SHARED,
            "arrival": {"type": "poisson", "rate": shared_rate},
            "num_requests": sized(shared_rate),
        },
        "multi-turn": {  # shorter turns: a 5-turn conversation stays within max_model_len
            "prompt_tokens": {"type": "uniform", "low": 32, "high": 256},
            "output_tokens": {"type": "uniform", "low": 16, "high": 64},
            "arrival": {"type": "poisson", "rate": sessions},
            "prefix": {
                "type": "multi_turn",
                "turns": {"type": "uniform", "low": 2, "high": 5},
                "think_time_s": 1.0,
                "system_prompt_tokens": 256,
            },
            "num_requests": sized(sessions, 3.5),
        },
    }


def shape_folder(work: Path, name: str) -> Path:
    """Where a shape's live repeats are written, and read back by the scoring."""
    return work / name.replace(" ", "_").replace("%", "pct")


def burst(requests: int, lengths: dict[str, Any] = LENGTHS) -> dict[str, Any]:
    return {**lengths, "arrival": {"type": "poisson", "rate": 1000.0}, "num_requests": requests}


@dataclass
class Setup:
    """What the live calibration produced: profiles, capacity and how they were measured."""

    idle: Path
    loaded: Path
    default: Path | None  # what `servesim calibrate` writes by default (None: not measured)
    capacity: float
    shared_capacity: float
    info: dict[str, Any]

    def shapes(self) -> dict[str, dict[str, Any]]:
        return shapes(self.capacity, self.shared_capacity, float(self.info["seconds"]))


def live_capacity(
    requests: dict[str, Any], profile: Path, target: Target, tokens: PromptTokens, out: Path
) -> tuple[float, float]:
    """A saturating burst of ``requests``: its completed rate live, and simulated."""
    saturating = scenario(requests, profile, seed=1)
    measured = run_live(saturating, target, tokens, out_dir=out)
    measured.write(out)
    return completed_rate(measured.records), completed_rate(build(saturating).run().records)


def calibrate(server: VLLMServer, tokens: PromptTokens, work: Path, args: Any) -> Setup:
    """Steps 1–4 of the module docstring."""
    budget_s = parse_budget(args.budget)
    plan = MeasurementPlan.for_budget(
        budget_s, max_model_len=2048, max_num_seqs=32, max_num_batched_tokens=2048
    )
    measurement = measure(
        server.url, server.model_name, tokens, plan, block_size=32, budget_s=budget_s
    )
    coefficients, report = fit_steps(measurement.observations)
    points = observations_to_json(measurement.observations)
    (work / "isolated-points.json").write_text(json.dumps(points, indent=1) + "\n")
    template = scenario(burst(1), None, 0)
    idle = fitted_profile(template, coefficients, report, engine=EngineInfo(name="vllm"))
    idle_path = idle.save(work / "profile-idle.json")
    probe_at_calibration = drift(server, PromptTokens(tokens.vocab_size, salt=999), idle_path)
    target = Target(server.url, server.model_name)
    capacity, simulated = live_capacity(
        burst(args.capacity_requests), idle_path, target, tokens, work / "capacity"
    )
    shared_capacity, shared_simulated = live_capacity(
        burst(args.capacity_requests, SHARED), idle_path, target, tokens, work / "capacity-shared"
    )
    training = scenario(
        {
            **LENGTHS,
            "arrival": {"type": "poisson", "rate": 0.5 * capacity},
            "num_requests": int(np.clip(round(0.5 * capacity * args.seconds), 24, 120)),
        },
        idle_path,
        seed=99,
    )
    trained = run_live(training, target, tokens, out_dir=work / "training")
    trained.write(work / "training")
    loaded_path = refit(training, work, coefficients, args.max_simulations)
    default_path, default_info = default_calibration(
        server, tokens, work, measurement.observations, coefficients, args
    )
    info = {
        "points": len(measurement.observations),
        "calibration_s": measurement.duration_s,
        "fit_error_mean": report.relative_error_mean,
        "capacity_rps": capacity,
        "simulated_capacity_rps": simulated,
        "shared_capacity_rps": shared_capacity,
        "simulated_shared_capacity_rps": shared_simulated,
        "training": training.workload.model_dump(mode="json"),
        "seconds": args.seconds,
        "probe_at_calibration": probe_at_calibration,
        "default": default_info,
    }
    (work / "bench.json").write_text(json.dumps(info, indent=2) + "\n")
    return Setup(idle_path, loaded_path, default_path, capacity, shared_capacity, info)


#: The default calibration's scenario: the shapes' common lengths (its arrivals are replaced).
def calibration_scenario() -> Scenario:
    workload = {**LENGTHS, "arrival": {"type": "poisson", "rate": 1.0}, "num_requests": 100}
    return scenario(workload, None, 98)


def default_calibration(
    server: VLLMServer,
    tokens: PromptTokens,
    work: Path,
    isolated: list[Observation],
    coefficients: CalibratedCoefficients,
    args: Any,
) -> tuple[Path, dict[str, Any]]:
    """What ``servesim calibrate`` does after its isolated points: loaded replays of the
    shapes' lengths within ``--loaded-budget``, their rebuilt steps fitted with the isolated
    points. Saved as ``profile-default.json``."""
    notes: list[str] = []
    runner = live_runner(Target(server.url, server.model_name), tokens.vocab_size, salt=5000)
    replays = run_loaded(
        calibration_scenario(),
        coefficients,
        runner,
        work / "loaded-replays",
        parse_budget(args.loaded_budget),
        notes=notes,
    )
    print(f"default calibration: {len(replays)} loaded replays; {'; '.join(notes) or 'no notes'}")
    return default_profile(work, isolated, coefficients, replays, notes)


def default_profile(
    work: Path,
    isolated: list[Observation],
    coefficients: CalibratedCoefficients,
    replays: list[Any],
    notes: list[str],
) -> tuple[Path, dict[str, Any]]:
    """The joint fit of the isolated points and the loaded replays, as profile-default.json."""
    joint = fit_loaded(calibration_scenario(), isolated, coefficients, replays)
    template = scenario(burst(1), None, 0)
    profile = fitted_profile(
        template, joint.coefficients, joint.report, engine=EngineInfo(name="vllm")
    )
    path = profile.save(work / "profile-default.json")
    info = {
        "replays": joint.replays,
        "run_notes": notes,  # what run_loaded said (replays not run)
        "notes": joint.report.notes,
        "held_out": joint.report.held_out,
    }
    return path, info


def refit(
    training: Scenario, work: Path, initial: CalibratedCoefficients, max_simulations: int
) -> Path:
    """The records fit of the training run, saved as ``profile-loaded.json``."""
    records = read_records(work / "training")
    coefficients, report, _ = fit_scenario_to_records(
        training, records, initial, max_evaluations=max_simulations
    )
    template = scenario(burst(1), None, 0)
    profile = fitted_profile(template, coefficients, report, engine=EngineInfo(name="vllm"))
    return profile.save(work / "profile-loaded.json")


def drift(server: VLLMServer, tokens: PromptTokens, profile: Path) -> float:
    """How the server's speed now compares with the profile: the geometric mean over the
    probe's points of measured / predicted seconds (1.2: 20% slower than the profile says)."""
    measurement = measure(server.url, server.model_name, tokens, PROBE, block_size=32)
    observations = measurement.observations
    predicted = predict_seconds(load_profile(profile).coefficients, observations)
    ratios = [obs.seconds / p for obs, p in zip(observations, predicted, strict=True) if p > 0]
    return float(np.exp(np.mean(np.log(ratios)))) if ratios else float("nan")


def live_runs(
    server: VLLMServer, tokens: PromptTokens, work: Path, setup: Setup, args: Any
) -> None:
    """Step 5: every shape ``--repeats`` times, results under ``work/<shape>/<repeat>``."""
    target = Target(server.url, server.model_name)
    for seed, (name, workload) in enumerate(setup.shapes().items(), 10):
        if args.shapes and name not in args.shapes:
            continue
        for repeat in range(args.repeats):
            out = shape_folder(work, name) / str(repeat)
            out.mkdir(parents=True, exist_ok=True)
            probe_tokens = PromptTokens(tokens.vocab_size, salt=1000 + seed * 10 + repeat)
            ratio = drift(server, probe_tokens, setup.idle)
            (out / "drift.json").write_text(json.dumps({"measured_over_profile": ratio}) + "\n")
            started = time.monotonic()
            salted = PromptTokens(tokens.vocab_size, salt=1 + repeat)
            result = run_live(scenario(workload, setup.idle, seed), target, salted, out_dir=out)
            result.write(out)
            lag = result.summary["live"]["load_generator_lag_s"]["p99"] or 0.0
            print(
                f"  live {name} #{repeat}: {len(result.records)} requests in "
                f"{time.monotonic() - started:.0f} s, send lag p99 {lag * 1e3:.1f} ms, "
                f"drift probe {ratio:.2f}× the profile",
                flush=True,
            )


def score(work: Path, setup: Setup) -> dict[str, Any]:
    """Per shape, profile and metric: sim/live − 1 over the repeats and the live spread."""
    table: dict[str, Any] = {}
    for seed, (name, workload) in enumerate(setup.shapes().items(), 10):
        folder = shape_folder(work, name)
        runs = sorted(folder.iterdir()) if folder.is_dir() else []
        lives = [
            json.loads((d / "summary.json").read_text())
            for d in runs
            if (d / "summary.json").exists()
        ]
        if not lives:
            continue  # not run (a run stopped early): scored without it
        # Runs from before the probe ran at calibration compare against the profile itself.
        baseline = float(setup.info.get("probe_at_calibration") or 1.0)
        drifts = [
            json.loads((d / "drift.json").read_text())["measured_over_profile"] / baseline
            for d in runs
            if (d / "drift.json").exists()
        ]
        table[f"{name}|drift"] = {
            "since_calibration": [float(x) for x in drifts],
            "mean": float(np.mean(drifts)) if drifts else None,
        }
        for label, path in (
            ("idle", setup.idle),
            ("loaded", setup.loaded),
            ("default", setup.default),
        ):
            if path is None:
                continue
            simulated = build(scenario(workload, path, seed)).run().summary
            for latency, stat in METRICS:
                live = np.array([s[latency][stat] for s in lives], dtype=np.float64)
                errors = simulated[latency][stat] / live - 1.0
                spread = float((live.max() - live.min()) / live.mean()) if live.size else 0.0
                mean = float(errors.mean())
                table[f"{name}|{label}|{latency} {stat}"] = {
                    "error_mean": mean,
                    "error_min": float(errors.min()),
                    "error_max": float(errors.max()),
                    "live_spread": spread,
                    "repeats": int(live.size),
                    "meets_target": bool(abs(mean) <= max(TARGET, spread)),
                }
    return table


def print_table(table: dict[str, Any], setup: Setup) -> None:
    info = setup.info
    print(
        f"calibration: {info['points']} points in {info['calibration_s']:.0f} s, fit error mean "
        f"{info['fit_error_mean']:.1%}; capacity measured live {info['capacity_rps']:.3f} req/s, "
        f"simulated {info['simulated_capacity_rps']:.3f} req/s "
        f"({info['simulated_capacity_rps'] / info['capacity_rps'] - 1:+.1%})"
    )
    if "shared_capacity_rps" in info:
        live, sim = info["shared_capacity_rps"], info["simulated_shared_capacity_rps"]
        print(
            f"shared-prompt capacity measured live {live:.3f} req/s, simulated {sim:.3f} req/s "
            f"({sim / live - 1:+.1%})"
        )
    for label in PROFILES:
        if not any(f"|{label}|" in key for key in table):
            continue
        print(f"\nprofile: {label}  (sim/live − 1: mean of the repeats [min, max]; spread; ok)")
        print(f"{'shape':<15}" + "".join(f"{f'{lat[:-2]} {st}':>27}" for lat, st in METRICS))
        shape_names = dict.fromkeys(key.split("|")[0] for key in table)
        for name in shape_names:
            cells = []
            probe = table.get(f"{name}|drift", {}).get("since_calibration") or []
            for latency, stat in METRICS:
                row = table[f"{name}|{label}|{latency} {stat}"]
                mark = "✓" if row["meets_target"] else "✗"
                cells.append(
                    f"{row['error_mean']:+.0%} [{row['error_min']:+.0%},{row['error_max']:+.0%}]"
                    f" {row['live_spread']:.0%}{mark}"
                )
            drift_text = " ".join(f"{x - 1:+.0%}" for x in probe) or "—"
            print(f"{name:<15}" + "".join(f"{c:>27}" for c in cells) + f"   drift {drift_text}")
        met = [r["meets_target"] for k, r in table.items() if f"|{label}|" in k]
        print(f"meets the target: {sum(met)} of {len(met)}")


def moved_replays(entries: list[dict[str, Any]], work: Path) -> list[dict[str, Any]]:
    """The loaded replays' summary entries with each directory read from under ``work`` where
    it is there (the run directory may have been moved or copied since), else as recorded."""
    moved = []
    for entry in entries:
        directory = Path(entry["directory"])
        local = work / "loaded-replays" / directory.name
        moved.append({**entry, "directory": str(local if local.is_dir() else directory)})
    return moved


def rescored_setup(work: Path, max_simulations: int) -> Setup:
    """A finished run's setup read back; the loaded profile refitted with today's code."""
    info = json.loads((work / "bench.json").read_text())
    idle = work / "profile-idle.json"
    training = scenario(info["training"], idle, seed=99)
    coefficients = load_profile(idle).coefficients
    loaded = refit(training, work, coefficients, max_simulations)
    # Runs from before the shared shape had its own capacity sized it from LENGTHS'.
    shared = info.get("shared_capacity_rps", info["capacity_rps"])
    default = work / "profile-default.json"
    points = work / "isolated-points.json"
    if points.is_file() and info.get("default"):
        # Refit the default profile from the saved isolated points and loaded replays.
        isolated = observations_from_json(json.loads(points.read_text()))
        replays = replays_from_summary(
            calibration_scenario(),
            moved_replays(info["default"]["replays"], work),
            max_num_batched_tokens=ENGINE.max_num_batched_tokens,
        )
        default, info["default"] = default_profile(
            work, isolated, coefficients, replays, info["default"].get("run_notes", [])
        )
    return Setup(
        idle,
        loaded,
        default if default.is_file() else None,
        float(info["capacity_rps"]),
        float(shared),
        info,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="8m", help="calibration time budget")
    parser.add_argument(
        "--loaded-budget", default="4m", help="the default calibration's loaded replays' budget"
    )
    parser.add_argument("--repeats", type=int, default=3, help="live runs of each shape")
    parser.add_argument("--seconds", type=float, default=120.0, help="length of each live run")
    parser.add_argument("--capacity-requests", type=int, default=48, help="size of the burst")
    parser.add_argument("--model", default=None, help="local model directory (default: ~85M)")
    parser.add_argument("--max-simulations", type=int, default=60, help="records refit budget")
    parser.add_argument("--out", default=None, help="output directory (default: a temp dir)")
    parser.add_argument("--rescore", default=None, help="score a finished run's directory")
    parser.add_argument("--json", action="store_true", help="print the table as JSON")
    parser.add_argument(
        "--shapes",
        type=lambda text: [name.strip() for name in text.split(",")],
        default=None,
        help="run only these shapes, comma-separated (e.g. 'multi-turn,poisson 30%%')",
    )
    args = parser.parse_args()
    known = shapes(1.0, 1.0, 1.0)
    unknown = [name for name in args.shapes or [] if name not in known]
    if unknown:
        parser.error(f"--shapes: unknown {unknown}; the shapes are {', '.join(known)}")
    if args.rescore:
        work = Path(args.rescore)
        setup = rescored_setup(work, args.max_simulations)
    else:
        work = Path(args.out or tempfile.mkdtemp(prefix="servesim-fidelity-"))
        work.mkdir(parents=True, exist_ok=True)
        model_dir = Path(args.model) if args.model else ensure_tiny_model(MODEL_85M)
        vocab = int(json.loads((model_dir / "config.json").read_text())["vocab_size"])
        tokens = PromptTokens(vocab)
        with VLLMServer(str(model_dir), ENGINE, log_path=work / "server.log") as server:
            setup = calibrate(server, tokens, work, args)
            print(f"capacity {setup.capacity:.3f} req/s; live runs:", flush=True)
            live_runs(server, tokens, work, setup, args)
    table = score(work, setup)
    (work / "fidelity.json").write_text(json.dumps(table, indent=2) + "\n")
    if args.json:
        print(json.dumps({"setup": setup.info, "table": table}, indent=2))
    else:
        print_table(table, setup)
    print(f"(outputs in {work})")


if __name__ == "__main__":
    main()
