"""The time series as it is sampled (sim/fleet/timeseries.py): every sample reaches the file,
the kept copy stays within its bound and keeps what the reports read from it (token counts,
the last gauges, the peak replica count)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import sim.fleet.timeseries as timeseries_module
import sim.simulation as simulation_module
from sim.fleet.timeseries import TIMESERIES_COLUMNS, Sample, SampledSeries, merge
from sim.report.outputs import TableWriter
from sim.run import build
from sim.scenario import parse_scenario
from tests.factories import scenario_dict


def samples(count: int, seed: int = 0) -> list[Sample]:
    """``count`` samples at uneven times (from 0), with random gauges and rates."""
    rng = np.random.default_rng(seed)
    times = np.concatenate([[0.0], np.cumsum(rng.uniform(0.2, 2.0, count - 1))])
    return [
        Sample(
            time_s=float(t),
            num_requests_waiting=int(rng.integers(0, 50)),
            num_requests_running=int(rng.integers(0, 50)),
            kv_cache_usage=float(rng.uniform()),
            prefix_cache_hit_rate=float(rng.uniform()),
            prompt_tokens_per_s=float(rng.uniform(0, 5000)),
            output_tokens_per_s=float(rng.uniform(0, 800)),
            busy_fraction=float(rng.uniform()),
            num_finished=i,
            num_ok=i,
            num_replicas=int(rng.integers(1, 9)),
            num_replicas_starting=int(rng.integers(0, 3)),
            num_replicas_draining=0,
            cost_usd_per_hour=float(rng.uniform(1, 30)),
        )
        for i, t in enumerate(times)
    ]


def tokens(frame: pd.DataFrame, column: str) -> float:
    """Rate × the interval each row covers, summed: the tokens the series accounts for."""
    times = frame["time_s"].to_numpy()
    return float((frame[column].to_numpy() * np.diff(times, prepend=0.0)).sum())


def test_a_short_series_keeps_every_sample_as_it_was() -> None:
    taken = samples(50)
    series = SampledSeries(max_rows=64)
    for sample in taken:
        series.add(sample)
    kept = series.frame()
    assert [tuple(row) for row in kept.itertuples(index=False)] == [tuple(s) for s in taken]
    assert series.stride == 1 and series.count == 50 and series.last == taken[-1]


@pytest.mark.parametrize("count", [65, 200, 1001])
def test_a_long_series_merges_rows_and_keeps_tokens_gauges_and_the_peak(count: int) -> None:
    taken = samples(count, seed=count)
    series = SampledSeries(max_rows=64)
    for sample in taken:
        series.add(sample)
    every = pd.DataFrame(taken, columns=list(TIMESERIES_COLUMNS))
    kept = series.frame()
    assert len(kept) <= 64 and series.stride > 1
    assert kept["time_s"].iloc[-1] == taken[-1].time_s
    assert kept["time_s"].is_monotonic_increasing
    for column in ("prompt_tokens_per_s", "output_tokens_per_s", "busy_fraction"):
        assert tokens(kept, column) == pytest.approx(tokens(every, column), rel=1e-9)
    # A kept row's gauges are those of the sample at its time (the end of what it merges).
    at = every.set_index("time_s").loc[kept["time_s"]]
    for column in ("num_requests_waiting", "kv_cache_usage", "num_ok", "cost_usd_per_hour"):
        assert (at[column].to_numpy() == kept[column].to_numpy()).all()
    replicas = every["num_replicas"] + every["num_replicas_starting"]
    assert series.peak_replicas == int(replicas.max())


def test_merging_averages_interval_columns_by_time_and_takes_the_last_gauges() -> None:
    a, b = samples(2, seed=3)
    a = a._replace(time_s=1.0, output_tokens_per_s=100.0, num_requests_waiting=7)
    b = b._replace(time_s=4.0, output_tokens_per_s=200.0, num_requests_waiting=2)
    row = merge([a, b], start_s=0.0)
    assert row.time_s == 4.0 and row.num_requests_waiting == 2
    assert row.output_tokens_per_s == pytest.approx((100 * 1 + 200 * 3) / 4)


def test_every_sample_reaches_the_writer_in_order(tmp_path: Path) -> None:
    taken = samples(500, seed=1)
    series = SampledSeries(max_rows=16, chunk_rows=7)
    writer = TableWriter(tmp_path / "timeseries.parquet")
    series.writer = writer
    for sample in taken:
        series.add(sample)
    series.flush()
    written = pd.read_parquet(writer.close())
    pd.testing.assert_frame_equal(
        written, pd.DataFrame(taken, columns=list(TIMESERIES_COLUMNS)), check_dtype=False
    )
    assert len(series.frame()) <= 16


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="max_rows"):
        SampledSeries(max_rows=3)


def long_scenario() -> dict[str, Any]:
    data = scenario_dict()
    data["workload"] = {
        "arrival": {"type": "constant", "rate": 2},
        "prompt_tokens": {"type": "constant", "value": 64},
        "output_tokens": {"type": "constant", "value": 8},
        "num_requests": 40,  # arrivals over ~20 s
    }
    data["output"] = {"sample_interval_s": 0.05}  # ~400 samples
    return data


def test_a_run_with_an_output_directory_writes_every_sample_and_keeps_a_bounded_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(timeseries_module, "MAX_KEPT", 32)
    monkeypatch.setattr(simulation_module, "MAX_SAMPLES", 16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the interval is not stretched: the file takes them all
        result = build(parse_scenario(long_scenario())).run(out_dir=tmp_path)
    assert result.timeseries_path == tmp_path / "timeseries.parquet"
    written = pd.read_parquet(result.timeseries_path)
    steps = written["time_s"].diff().iloc[1:-1]
    assert len(written) > 300 and steps.to_numpy() == pytest.approx(0.05)
    kept = result.timeseries
    assert len(kept) <= 32
    assert kept["time_s"].iloc[-1] == written["time_s"].iloc[-1]
    for column in ("prompt_tokens_per_s", "output_tokens_per_s"):
        assert tokens(kept, column) == pytest.approx(tokens(written, column), rel=1e-9)
    assert tokens(written, "output_tokens_per_s") == pytest.approx(40 * 8)
    # Writing the result lists the sampled file and leaves it as it is.
    paths = result.write(tmp_path)
    assert result.timeseries_path in paths
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "timeseries.parquet"), written)
    assert result.summary["sim"]["events"] >= len(written)


def test_a_run_without_one_stretches_its_interval_instead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(simulation_module, "MAX_SAMPLES", 16)
    with pytest.warns(UserWarning, match="output.sample_interval_s"):
        result = build(parse_scenario(long_scenario())).run()
    assert result.timeseries_path is None
    assert 16 <= len(result.timeseries) <= 32


def test_how_often_a_run_samples_does_not_change_its_records() -> None:
    # Sampling reads every replica (and syncs fast-forwarded decode runs): it must not move
    # a single request.
    frames = []
    for interval in (0.01, 0.37, 5.0):
        data = long_scenario()
        data["workload"]["arrival"] = {"type": "poisson", "rate": 6}
        data["output"] = {"sample_interval_s": interval}
        frames.append(build(parse_scenario(data)).run().records)
    for frame in frames[1:]:
        pd.testing.assert_frame_equal(frame, frames[0])


def test_an_interrupted_run_leaves_readable_files_with_what_it_had(tmp_path: Path) -> None:
    def interrupt(done: int, total: int) -> None:
        if done >= total // 2:
            raise KeyboardInterrupt

    simulation = build(parse_scenario(long_scenario()))
    with pytest.raises(KeyboardInterrupt):
        simulation.run(progress=interrupt, stream=True, out_dir=tmp_path)
    samples = pd.read_parquet(tmp_path / "timeseries.parquet")
    records = pd.read_parquet(tmp_path / "records.parquet")
    assert len(samples) > 10 and samples["time_s"].is_monotonic_increasing
    assert 0 < len(records) < 40 and (records["status"] == "ok").all()
