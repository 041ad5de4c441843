"""Sweeps: a grid (or a list) of scenario overrides × seeds, run in parallel, into one table.

A sweep file::

    base: scenarios/fleet_autoscaling.yaml      # a scenario file (relative to the sweep file)
    grid:                                       # every combination of these dotted overrides
      fleet.replicas: [1, 2, 4]
      workload.arrival.rate: [5, 10]
    # or:  runs: [{fleet.replicas: 1}, {fleet.replicas: 2, dtype: fp8}]
    seeds: [0, 1, 2]                            # replications (default [scenario seed])

Each run's row holds the overrides (one column each, named by their dotted path), the seed,
and the summary's headline numbers (:data:`METRICS`). :func:`confidence_intervals` turns the
replications into mean ± a Student-t 95 % half-width per metric. Runs go to local processes
by default; the table is the same whichever executor runs them (each run is deterministic in
its scenario and seed).
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from sim.files import DocumentError, read_document
from sim.planning.parallel import collect, run_all
from sim.run import summary_or_error

#: Summary numbers each row records: column name → path in the summary.
METRICS: dict[str, tuple[str, ...]] = {
    "ttft_mean_s": ("ttft_s", "mean"),
    "ttft_p50_s": ("ttft_s", "p50"),
    "ttft_p90_s": ("ttft_s", "p90"),
    "ttft_p99_s": ("ttft_s", "p99"),
    "tpot_mean_s": ("tpot_s", "mean"),
    "tpot_p90_s": ("tpot_s", "p90"),
    "e2e_p90_s": ("e2e_s", "p90"),
    "output_tokens_per_s": ("throughput", "output_tokens_per_s"),
    "requests_per_s": ("throughput", "requests_per_s"),
    "slo_attainment": ("goodput", "slo_attainment"),
    "prefix_hit_rate": ("prefix_cache", "hit_rate"),
    "preemptions": ("preemptions",),
    "usd_per_hour": ("cost", "usd_per_hour"),
    "usd_per_million_output_tokens": ("cost", "usd_per_million_output_tokens"),
    "stable": ("stability", "stable"),
}


@dataclass(frozen=True)
class Run:
    """One point of the sweep: the overrides applied to the base and the seed; with
    ``records``, the directory its worker streams the run's records to."""

    overrides: tuple[tuple[str, Any], ...]
    seed: int
    records: str | None = None


@dataclass(frozen=True)
class Sweep:
    base: dict[str, Any]
    runs: tuple[Run, ...]
    parameters: tuple[str, ...]


def set_path(data: dict[str, Any], path: str, value: Any) -> None:
    """``data["a"]["b"] = value`` for ``path`` "a.b", creating sections on the way."""
    keys = path.split(".")
    node = data
    for key in keys[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = {}
            node[key] = child
        node = child
    node[keys[-1]] = value


def load_sweep(path: str | Path) -> Sweep:
    """Read a sweep file; ValueError naming the field when it is malformed."""
    path = Path(path)
    try:
        document = read_document(path, format="yaml")
    except DocumentError as exc:
        raise ValueError(f"{path}: cannot read the sweep: {exc.problem}") from None
    return parse_sweep(document, path.parent)


def parse_sweep(document: Any, directory: Path = Path()) -> Sweep:
    if not isinstance(document, dict):
        raise ValueError("sweep: must be a mapping with base, grid or runs, and seeds")
    unknown = set(document) - {"base", "grid", "runs", "seeds"}
    if unknown:
        raise ValueError(f"sweep: unknown keys {sorted(unknown)}; use base, grid, runs, seeds")
    base = document.get("base")
    if isinstance(base, str):
        base_path = directory / base if not Path(base).is_absolute() else Path(base)
        try:
            base = read_document(base_path, format="yaml")
        except DocumentError as exc:
            raise ValueError(f"sweep.base: cannot read {base_path}: {exc.problem}") from None
    if not isinstance(base, dict):
        raise ValueError("sweep.base: a scenario file path or an inline scenario mapping")
    if ("grid" in document) == ("runs" in document):
        raise ValueError("sweep: give exactly one of grid (combinations) or runs (a list)")
    points: list[dict[str, Any]]
    if "grid" in document:
        grid = document["grid"]
        if (
            not isinstance(grid, dict)
            or not grid
            or not all(isinstance(v, list) and v for v in grid.values())
        ):
            raise ValueError("sweep.grid: a mapping of dotted paths to non-empty value lists")
        names = list(grid)
        points = [
            dict(zip(names, combo, strict=True)) for combo in itertools.product(*grid.values())
        ]
    else:
        runs = document["runs"]
        if not isinstance(runs, list) or not runs or not all(isinstance(r, dict) for r in runs):
            raise ValueError("sweep.runs: a non-empty list of {dotted.path: value} mappings")
        points = runs
    seeds = document.get("seeds", [base.get("seed", 0)])
    if (
        not isinstance(seeds, list)
        or not seeds
        or not all(isinstance(s, int) and s >= 0 for s in seeds)
    ):
        raise ValueError("sweep.seeds: a non-empty list of integers >= 0")
    parameters = tuple(dict.fromkeys(key for point in points for key in point))
    runs_out = tuple(Run(tuple(sorted(point.items())), seed) for point in points for seed in seeds)
    return Sweep(base, runs_out, parameters)


def scenario_for(base: dict[str, Any], run: Run) -> dict[str, Any]:
    data = copy.deepcopy(base)
    for path, value in run.overrides:
        set_path(data, path, value)
    data["seed"] = run.seed
    return data


def run_one(base: dict[str, Any], run: Run) -> dict[str, Any]:
    """One row: the overrides, the seed, the headline numbers, and an error if it could not
    run (a top-level function: it runs in worker processes)."""
    row: dict[str, Any] = dict(run.overrides)
    row["seed"] = run.seed
    summary, row["error"] = summary_or_error(scenario_for(base, run), records_dir=run.records)
    if run.records is not None and not row["error"]:
        row["records"] = str(Path(run.records) / "records.parquet")
    if row["error"]:
        return row
    for column, keys in METRICS.items():
        value: Any = summary
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        row[column] = value
    return row


def run_sweep(
    sweep: Sweep,
    *,
    workers: int = 2,
    executor: str = "process",
    ray_address: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    records_dir: str | Path | None = None,
) -> pd.DataFrame:
    """Every run of the sweep, as one table in the sweep's order; ``progress(done, total)``
    after each run.

    With ``records_dir``, each worker streams its run's records and time series to
    ``records_dir/run-NNNN/records.parquet`` and ``timeseries.parquet`` (NNNN: the run's place
    in the sweep; on a Ray cluster, a directory every node can write), and the table's
    ``records`` column names the directory.
    """
    if records_dir is not None:
        runs = tuple(
            replace(run, records=str(Path(records_dir) / f"run-{i:04d}"))
            for i, run in enumerate(sweep.runs)
        )
        sweep = replace(sweep, runs=runs)
    if executor == "ray":
        rows = _run_on_ray(sweep, ray_address, progress)
    else:
        rows = run_all(run_one, sweep.base, sweep.runs, workers=workers, progress=progress)
    return _table(rows, sweep.parameters)


def _run_on_ray(
    sweep: Sweep, address: str | None, progress: Callable[[int, int], None] | None
) -> list[dict[str, Any]]:
    try:
        import ray  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        raise ValueError("--ray: ray is not installed; pip install 'servesim[ray]'") from None
    started_here = not ray.is_initialized()
    if started_here:
        if address in (None, "local"):
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        else:
            ray.init(address=address, log_to_driver=False)
    try:
        remote = ray.remote(run_one)
        base_ref = ray.put(sweep.base)
        refs = [remote.remote(base_ref, run) for run in sweep.runs]
        rows: list[dict[str, Any]] = collect(refs, ray.get, progress)
        return rows
    finally:
        if started_here:
            ray.shutdown()


def _table(rows: Sequence[dict[str, Any]], parameters: Iterable[str]) -> pd.DataFrame:
    columns = [*parameters, "seed", "error", *METRICS]
    if any("records" in row for row in rows):
        columns.append("records")
    frame = pd.DataFrame(list(rows))
    for column in columns:
        if column not in frame.columns:
            frame[column] = None
    return frame[columns]


def confidence_intervals(table: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """Per combination of overrides: the mean of every metric over its seeds, and the half-width
    of its Student-t ``level`` interval (NaN with one seed)."""
    parameters = [c for c in table.columns if c not in ("seed", "error", "records", *METRICS)]
    ok = table[table["error"] == ""]
    rows = []
    groups = ok.groupby(parameters, dropna=False, sort=False) if parameters else [((), ok)]
    for key, group in groups:
        row: dict[str, Any] = dict(
            zip(parameters, key if isinstance(key, tuple) else (key,), strict=True)
        )
        row["replications"] = len(group)
        for metric in METRICS:
            values = pd.to_numeric(group[metric], errors="coerce").dropna().to_numpy(dtype=float)
            mean = float(values.mean()) if values.size else math.nan
            half = math.nan
            if values.size > 1:
                sem = float(values.std(ddof=1)) / math.sqrt(values.size)
                half = float(stats.t.ppf(0.5 + level / 2, values.size - 1)) * sem
            row[metric] = mean
            row[f"{metric}_ci"] = half
        rows.append(row)
    return pd.DataFrame(rows)


def replications(
    base: dict[str, Any],
    num_seeds: int,
    *,
    workers: int = 2,
    level: float = 0.95,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """The scenario ``base`` run with ``num_seeds`` consecutive seeds from its own: per metric
    of :data:`METRICS`, the mean over the seeds and the half-width of its Student-t ``level``
    interval; ``progress(done, total)`` after each seed. Raises ValueError if a replication
    cannot run."""
    if num_seeds < 2:
        raise ValueError(f"replications: need at least 2 seeds for an interval, got {num_seeds}")
    first = int(base.get("seed", 0))
    sweep = Sweep(base, tuple(Run((), first + i) for i in range(num_seeds)), ())
    table = run_sweep(sweep, workers=workers, progress=progress)
    failed = table[table["error"] != ""]
    if not failed.empty:
        raise ValueError(f"seed {failed['seed'].iloc[0]}: {failed['error'].iloc[0]}")
    row = confidence_intervals(table, level).iloc[0]
    return {
        "seeds": [first + i for i in range(num_seeds)],
        "level": level,
        "metrics": {
            metric: {"mean": _finite(row[metric]), "half_width": _finite(row[f"{metric}_ci"])}
            for metric in METRICS
        },
    }


def _finite(value: Any) -> float | None:
    number = float(value)
    return number if math.isfinite(number) else None


def write_table(table: pd.DataFrame, path: str | Path) -> Path:
    """Parquet (or CSV for a .csv path); override values of mixed types are kept as text."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = table.copy()
    for column in table.columns:
        if table[column].dtype == object and column != "error":
            kinds = {type(v) for v in table[column] if v is not None}
            if len(kinds) > 1 or (kinds and not kinds <= {str, int, float, bool, np.float64}):
                table[column] = table[column].map(lambda v: None if v is None else str(v))
    if path.suffix == ".csv":
        table.to_csv(path, index=False)
    else:
        table.to_parquet(path, index=False)
    return path
