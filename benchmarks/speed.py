"""Simulation speed on the reference scenarios of issue 7 (R1–R4, see sim/reference.py).

For each scenario, the fast-forward engine and the step-by-step engine are run side by side in
this one invocation, each in a fresh process (so that peak RSS is its own): simulated seconds
per wall second, requests and engine steps per wall second, peak RSS, and the speed-up of the
fast mode. Both modes produce the same records (tests/test_fast_forward.py); the last column
checks it here too (a digest of the records frame). Targets: R1 ≥ 1,000× real time; R2 under
60 s wall and 2 GB.

Run: ``.venv/bin/python benchmarks/speed.py [--full] [--scale 0.1] [--fast-only]
[--scenarios R1,R2]``.
``--full`` adds R2 (576,000 requests; minutes). ``--scale`` shrinks every scenario's request
count (the ratios barely depend on it once there are a few thousand requests).
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import resource
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pandas as pd

from sim.reference import reference_scenario
from sim.run import build
from sim.scenario import parse_scenario


def measure(name: str, scale: float, fast_forward: bool) -> dict[str, Any]:
    """One run, in the calling process: speed, peak RSS and a digest of the records."""
    data = reference_scenario(name, scale)
    data["simulator"] = {"fast_forward": fast_forward}
    simulation = build(parse_scenario(data))
    started = time.perf_counter()
    result = simulation.run()
    wall = time.perf_counter() - started
    fleet = simulation.fleet
    steps = sum(r.num_steps for r in fleet.replicas) if fleet is not None else 0
    digest = hashlib.sha256(pd.util.hash_pandas_object(result.records).to_numpy()).hexdigest()
    return {
        "requests": len(result.records),
        "wall_s": wall,
        "sim_per_wall": result.summary["sim"]["simulated_s"] / wall,
        "requests_per_s": len(result.records) / wall,
        "steps_per_s": steps / wall,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
        "digest": digest[:12],
    }


def in_fresh_process(name: str, scale: float, fast_forward: bool) -> dict[str, Any]:
    """:func:`measure` in a new process, so its peak RSS is not another run's."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(measure, name, scale, fast_forward).result()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="also run R2 (576k requests)")
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of each workload")
    parser.add_argument(
        "--fast-only", action="store_true", help="skip the step-by-step runs (no ratio)"
    )
    parser.add_argument("--scenarios", help="comma-separated subset, e.g. R1,R2")
    args = parser.parse_args()
    names = ["R1", "R3", "R4"] + (["R2"] if args.full else [])
    if args.scenarios:
        names = [name.strip() for name in args.scenarios.split(",")]
    header = (
        "scenario", "mode", "requests", "wall s", "sim s/wall s", "req/s", "steps/s",
        "peak RSS GB", "speed-up", "same records",
    )  # fmt: skip
    print("".join(f"{h:>13}" for h in header))
    for name in names:
        fast = in_fresh_process(name, args.scale, True)
        step = None if args.fast_only else in_fresh_process(name, args.scale, False)
        for mode, m in (("fast", fast), ("step", step)):
            if m is None:
                continue
            speed_up = f"{step['wall_s'] / m['wall_s']:.2f}x" if step is not None else "-"
            same = "-" if step is None else ("yes" if fast["digest"] == step["digest"] else "NO")
            print(
                f"{name:>13}{mode:>13}{m['requests']:>13,.0f}{m['wall_s']:>13.2f}"
                f"{m['sim_per_wall']:>13.0f}{m['requests_per_s']:>13,.0f}"
                f"{m['steps_per_s']:>13,.0f}{m['peak_rss_gb']:>13.2f}{speed_up:>13}{same:>13}"
            )
    print("targets: R1 >= 1,000x real time; R2 < 60 s wall and < 2 GB peak RSS")


if __name__ == "__main__":
    main()
