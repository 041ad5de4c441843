"""``servesim calibrate --url`` on the real server, by default: the isolated points, then loaded
replays of the scenario's requests whose rebuilt steps are fitted with them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from servesim.cli import app

SCENARIO = Path(__file__).parents[2] / "scenarios" / "live_cpu_tiny.yaml"


def test_calibrate_fits_isolated_points_and_loaded_replays(
    vllm_server: Any, tmp_path: Path
) -> None:
    out = tmp_path / "cpu.json"
    args = [str(SCENARIO), "--url", vllm_server.url, "--budget", "70s", "--out", str(out)]
    result = CliRunner().invoke(app, ["calibrate", *args])
    assert result.exit_code == 0, result.output
    profile = json.loads(out.read_text())
    assert profile["fit"]["method"] == "isolated_points_and_loaded_steps"
    summary = profile["data_summary"]
    replays = summary["loaded_replays"]
    assert [r["name"] for r in replays][:2] == ["burst", "poisson 50%"], profile["fit"]["notes"]
    for replay in replays:
        assert replay["steps_rebuilt"] > 20, replay
        assert replay["completed_rps"] > 0
        # The server counted its own steps (vllm:iteration_tokens_total) during the replay.
        assert replay["server_steps"] and replay["server_steps"] > 0
        folder = Path(replay["directory"])
        assert (folder / "records.parquet").is_file()
        assert (folder / "token_times.parquet").is_file()
    # The Poisson load is half of what the burst measured.
    assert replays[1]["offered_rps"] == replays[0]["completed_rps"] * 0.5
    # Each replay left out in turn, and the isolated points' own profile kept beside.
    assert {h["workload"] for h in profile["fit"]["held_out"]} == {r["name"] for r in replays}
    isolated = json.loads(Path(summary["isolated_profile"]).read_text())
    assert isolated["fit"]["method"] == "step_least_squares"
    assert profile["fit"]["num_points"] > isolated["fit"]["num_points"]
