"""benchmarks/tp_scaling.py keeps running: its cited runs parse, and a run's lengths simulate
at every TP degree (a wider group decodes faster, by less than its width)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from benchmarks.tp_scaling import MODELS, RUNS, median_tpot_ms, requests


def test_the_cited_runs_simulate_and_a_wider_group_is_faster_but_sublinear(
    tmp_path: Path,
) -> None:
    runs = pd.read_csv(RUNS)
    assert len(runs) == 22 and set(runs["model"]) <= set(MODELS)
    assert {"median_tpot_ms", "input_lens", "output_lens", "source_file", "commit"} <= set(runs)
    llama = runs[
        (runs["model"] == "meta-llama/Meta-Llama-3-8B-Instruct") & (runs["gpu"] == "H100-80GB-SXM")
    ]
    by_tp = {int(run["tp"]): run for _, run in llama.iterrows()}
    assert sorted(by_tp) == [1, 2, 4, 8]
    # Requests with fewer than two tokens have no TPOT and are left out.
    assert all(output > 1 for _, output in requests(by_tp[1]))
    tpot = {tp: median_tpot_ms(run, tmp_path / "run.jsonl", None) for tp, run in by_tp.items()}
    assert tpot[1] > tpot[2] > tpot[4] > tpot[8] > 0
    assert tpot[1] / tpot[8] < 8  # fixed times (kernels, all-reduces, the step) do not divide
