"""Simulation speed on the reference scenarios of issue 7 (R1–R4, see sim/reference.py).

For each scenario, in this one invocation and each in a fresh process (so that peak RSS is its
own): the compiled engine (mypyc, tools/build_native.py) with fast-forward, the pure-Python
engine with fast-forward, and the pure-Python engine step by step. Printed: simulated seconds
per wall second, requests and engine steps per wall second, the wall time per engine step, peak
RSS, each mode's speed-up over the pure-Python fast-forward run, and whether its records are
bit-identical to that run's (a digest of the records frame). Targets (issue 17): R1 ≥ 2,000×
real time; R2 ≤ 30 s wall and ≤ 1 GB; the default scenario at 10M requests (``default``) in
under 10 minutes and 2 GB.

Run: ``.venv/bin/python benchmarks/speed.py [--full] [--scale 0.1] [--fast-only]
[--scenarios R1,R2,default] [--stream] [--profile R1]``.
``--full`` adds R2 (576,000 requests; minutes). ``--scale`` shrinks every scenario's request
count (the ratios barely depend on it once there are a few thousand requests). ``--fast-only``
skips the step-by-step runs. ``default`` is the embedded default scenario with 10M requests
(times ``--scale``). ``--stream`` streams every run's records to a temporary Parquet file in
chunks (``servesim run --records stream``), whose digest, sorted by request id, is compared.
``--profile R1`` runs one scenario under cProfile (pure Python, so
that every engine function shows) and prints the functions that take the most time per step.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import io
import multiprocessing
import os
import pstats
import resource
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def python_sources(where: str) -> None:
    """Import ``sim`` from a copy of its sources without the compiled extensions (a worker's
    initializer: it runs before anything imports ``sim``)."""
    sys.path.insert(0, where)


def scenario_data(name: str, scale: float) -> dict[str, Any]:
    """Reference scenario ``name``, or (``default``) the default scenario with 10M requests,
    times ``scale``."""
    from sim.reference import reference_scenario
    from sim.scenario.load import default_scenario_text, parse_yaml

    if name != "default":
        return reference_scenario(name, scale)
    data: dict[str, Any] = parse_yaml(default_scenario_text(), "default scenario")
    data["workload"]["num_requests"] = max(1, int(10_000_000 * scale))
    return data


def measure(name: str, scale: float, fast_forward: bool, stream: bool = False) -> dict[str, Any]:
    """One run, in the calling process: speed, peak RSS and a digest of the records."""
    import pandas as pd

    import sim.engine.scheduler
    from sim.run import build
    from sim.scenario import parse_scenario

    data = scenario_data(name, scale)
    data["simulator"] = {"fast_forward": fast_forward}
    simulation = build(parse_scenario(data))
    with tempfile.TemporaryDirectory() as out:
        started = time.perf_counter()
        result = simulation.run(stream=stream, out_dir=out if stream else None)
        wall = time.perf_counter() - started
        # The run's own peak, before a streamed run's file is read back whole for the digest.
        peak_rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
        samples = len(result.timeseries)
        if stream:
            import pyarrow.parquet as pq

            # Every sample the run took went to the file as it was taken.
            samples = pq.ParquetFile(Path(out) / "timeseries.parquet").metadata.num_rows
            records = pd.read_parquet(Path(out) / "records.parquet")
            records = records.sort_values("request_id").reset_index(drop=True)
        else:
            records = result.records
    fleet = simulation.fleet
    steps = sum(r.num_steps for r in fleet.replicas) if fleet is not None else 0
    digest = hashlib.sha256(pd.util.hash_pandas_object(records).to_numpy()).hexdigest()
    return {
        "compiled": not sim.engine.scheduler.__file__.endswith(".py"),
        "requests": len(records),
        "wall_s": wall,
        "sim_per_wall": result.summary["sim"]["simulated_s"] / wall,
        "requests_per_s": len(records) / wall,
        "steps_per_s": steps / wall,
        "us_per_step": wall / steps * 1e6 if steps else float("nan"),
        "peak_rss_gb": peak_rss_gb,
        "samples": samples,
        "digest": digest[:12],
    }


def in_fresh_process(
    name: str, scale: float, fast_forward: bool, sources: str | None = None, stream: bool = False
) -> dict[str, Any]:
    """:func:`measure` in a new process, so its peak RSS is not another run's; with
    ``sources``, on the pure-Python modules copied there."""
    context = multiprocessing.get_context("spawn")
    initializer = (python_sources, (sources,)) if sources else (None, ())
    with ProcessPoolExecutor(
        max_workers=1, mp_context=context, initializer=initializer[0], initargs=initializer[1]
    ) as pool:
        return pool.submit(measure, name, scale, fast_forward, stream).result()


def profile(name: str, scale: float, sources: str) -> None:
    """Run ``name`` under cProfile on the Python sources; print the top functions per step."""
    sys.path.insert(0, sources)
    from sim.run import build
    from sim.scenario import parse_scenario

    simulation = build(parse_scenario(scenario_data(name, scale)))
    profiler = cProfile.Profile()
    profiler.enable()
    simulation.run()
    profiler.disable()
    fleet = simulation.fleet
    steps = sum(r.num_steps for r in fleet.replicas) if fleet is not None else 0
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    per_step_us = stats.total_tt / steps * 1e6  # type: ignore[attr-defined]
    print(
        f"{name}: {steps:,} engine steps, {per_step_us:.1f} us per step under cProfile (its "
        "overhead included); the 15 functions with the most own time:"
    )
    stats.sort_stats("tottime").print_stats(15)
    print(text.getvalue().split("\n\n", 2)[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="also run R2 (576k requests)")
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of each workload")
    parser.add_argument("--fast-only", action="store_true", help="skip the step-by-step runs")
    parser.add_argument("--scenarios", help="comma-separated subset, e.g. R1,R2")
    parser.add_argument("--profile", metavar="NAME", help="profile one scenario instead")
    parser.add_argument("--stream", action="store_true", help="stream records to Parquet in chunks")
    parser.add_argument("--compiled-only", action="store_true", help="skip the pure-Python runs")
    args = parser.parse_args()
    names = ["R1", "R3", "R4"] + (["R2"] if args.full else [])
    if args.scenarios:
        names = [name.strip() for name in args.scenarios.split(",")]
    # The copy's sim/reference.py would look for the traces beside the copy.
    os.environ.setdefault("SERVESIM_SHARED_DATA", str(ROOT.parent / "shared" / "data"))
    with tempfile.TemporaryDirectory() as tmp:
        sources = str(Path(tmp) / "python")
        shutil.copytree(
            ROOT / "sim",
            Path(sources) / "sim",
            ignore=shutil.ignore_patterns("*.so", "__pycache__"),
        )
        if args.profile:
            profile(args.profile, args.scale, sources)
            return
        run_all(names, args.scale, args.fast_only, sources, args.stream, args.compiled_only)


def run_all(
    names: list[str],
    scale: float,
    fast_only: bool,
    sources: str,
    stream: bool = False,
    compiled_only: bool = False,
) -> None:
    """The table: each scenario in each mode, side by side."""
    header = (
        "scenario", "mode", "requests", "wall s", "sim s/wall s", "req/s", "steps/s",
        "us/step", "peak RSS GB", "samples", "speed-up", "same records",
    )  # fmt: skip
    print("".join(f"{h:>15}" if h == "mode" else f"{h:>13}" for h in header))
    for name in names:
        runs: dict[str, dict[str, Any]] = {}
        native = in_fresh_process(name, scale, True, stream=stream)
        if native["compiled"]:
            runs["compiled fast"] = native
        if not compiled_only or not native["compiled"]:
            runs["python fast"] = in_fresh_process(name, scale, True, sources, stream)
        if not fast_only and not compiled_only:
            runs["python step"] = in_fresh_process(name, scale, False, sources, stream)
        base = runs.get("python fast", native)
        for mode, m in runs.items():
            speed_up = f"{base['wall_s'] / m['wall_s']:.2f}x"
            same = "yes" if m["digest"] == base["digest"] else "NO"
            print(
                f"{name:>13}{mode:>15}{m['requests']:>13,.0f}{m['wall_s']:>13.2f}"
                f"{m['sim_per_wall']:>13.0f}{m['requests_per_s']:>13,.0f}"
                f"{m['steps_per_s']:>13,.0f}{m['us_per_step']:>13.1f}{m['peak_rss_gb']:>13.2f}"
                f"{m['samples']:>13,}{speed_up:>13}{same:>13}"
            )
        if not native["compiled"]:
            print(f"{'':>13}(no compiled engine: `make native` builds it)")
    print(
        "targets: R1 >= 2,000x real time; R2 <= 30 s wall and <= 1 GB peak RSS; default "
        "(10M requests) < 10 min and < 2 GB"
    )


if __name__ == "__main__":
    main()
