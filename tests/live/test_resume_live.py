"""A live run whose vLLM server is killed half-way, resumed with ``servesim live run --resume``
against a fresh server: every request ends ok exactly once, and the fresh server's own counters
show that only the requests that had not completed were sent again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import yaml

from live.replay import ReplayOptions, Target
from live.run import RECORDS_META_FILE, run_live
from live.server import VLLMServer
from live.tokens import PromptTokens
from sim.run import scenario_requests
from sim.scenario import load_scenario
from tests.live.conftest import LIVE_ENGINE
from tests.live.test_replay import live_scenario, vocab

NUM_REQUESTS = 40


def test_a_run_cut_short_by_a_dead_server_resumes_on_a_fresh_one(
    tiny_model_dir: Path, tmp_path: Path, no_orphans: str
) -> None:
    path = tmp_path / "live.yaml"
    path.write_text(yaml.safe_dump(live_scenario(num_requests=NUM_REQUESTS, rate=5.0)))
    scenario = load_scenario(path)
    requests = scenario_requests(scenario)
    out = tmp_path / "out"

    # The first run: its server is killed (SIGKILL, the whole group) about half-way.
    first_server = VLLMServer(str(tiny_model_dir), LIVE_ENGINE, log_path=tmp_path / "first.log")
    first_server.start()
    try:
        pgid = first_server.pid
        assert pgid is not None
        killer = threading.Timer(4.0, lambda: os.killpg(pgid, signal.SIGKILL))
        killer.start()
        first = run_live(
            scenario,
            Target(first_server.url, first_server.model_name),
            PromptTokens(vocab(tiny_model_dir)),
            out_dir=out,
            options=ReplayOptions(warmup_requests=1, read_timeout_s=10, timeout_s=30),
        )
        killer.join()
    finally:
        first_server.stop()
    assert first.summary["live"]["interrupted"]
    assert (out / RECORDS_META_FILE).exists()
    before = {
        row["request_id"]: (line, row)
        for line in (out / "records.jsonl").read_text().splitlines()
        for row in [json.loads(line)]
    }
    assert sorted(before) == list(range(NUM_REQUESTS))
    completed = {i for i, (_, row) in before.items() if row["status"] == "ok"}
    assert 3 <= len(completed) <= NUM_REQUESTS - 5, len(completed)
    unfinished = [r for r in requests if r.request_id not in completed]

    # The resume, through the command line, against a fresh server.
    with VLLMServer(str(tiny_model_dir), LIVE_ENGINE, log_path=tmp_path / "second.log") as server:
        command = [sys.executable, "-m", "servesim.cli", "live", "run", str(path), "--resume"]
        options = ["--url", server.url, "--model", str(tiny_model_dir), "--out", str(out)]
        completed_process = subprocess.run(
            [*command, *options], capture_output=True, text=True, timeout=300, check=False
        )
    assert completed_process.returncode == 0, completed_process.stderr[-3000:]
    assert f"resumed: {len(completed)} records reused" in completed_process.stdout

    lines = (out / "records.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert sorted(row["request_id"] for row in rows) == list(range(NUM_REQUESTS))  # once each
    assert all(row["status"] == "ok" for row in rows), [r["error"] for r in rows]
    after = dict(zip((row["request_id"] for row in rows), lines, strict=True))
    assert all(after[i] == before[i][0] for i in completed)  # kept byte for byte

    summary = json.loads((out / "summary.json").read_text())
    assert summary["requests"]["ok"] == NUM_REQUESTS
    assert summary["live"]["resume"] == {
        "resumed": True,
        "reused": len(completed),
        "sent": len(unfinished),
    }
    # The fresh server's counters (scraped after the warm-up): exactly the unfinished requests.
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["prompt_tokens"] == sum(r.prompt_tokens for r in unfinished)
    assert metrics["generation_tokens"] == sum(r.output_tokens for r in unfinished)
