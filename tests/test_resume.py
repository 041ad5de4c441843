"""Resuming an interrupted live run from its records file, against the fault-injecting server.

A run is cut short by a server that stops answering half-way; the resume, against a healthy
server, must send exactly the requests that did not complete (counted at the server) and leave a
records file with one final record per request. Records files that cannot be resumed from are
refused with a one-line error.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from live.cli import _print_failures
from live.replay import (
    RecordsFileError,
    RecordsFileWarning,
    ReplayOptions,
    Target,
    read_records,
)
from live.run import RECORDS_META_FILE, LiveResult, read_resume, records_meta, run_live
from live.tokens import PromptTokens
from servesim.cli import app
from sim.engine.request import Record, Request, RequestStatus
from sim.run import scenario_requests
from sim.scenario import Scenario, parse_scenario
from tests.factories import scenario_dict
from tests.fault_server import FaultServer

VOCAB = 1000
#: The warm-up requests each run sends before the measured part (see ReplayOptions).
WARMUP = 1
OPTIONS = ReplayOptions(warmup_requests=WARMUP, timeout_s=10, read_timeout_s=10)


@pytest.fixture
def server() -> Iterator[FaultServer]:
    """A fault server of the test's own, so its request log and "dies" count start at zero."""
    fault_server = FaultServer()
    fault_server.start()
    try:
        yield fault_server
    finally:
        fault_server.stop()


def scenario_spec(num_requests: int = 40, rate: float = 200.0, **workload: Any) -> dict[str, Any]:
    """A small workload: short prompts and answers, so the fault server answers at once."""
    spec: dict[str, Any] = {
        "arrival": {"type": "poisson", "rate": rate},
        "prompt_tokens": {"type": "uniform", "low": 16, "high": 64},
        "output_tokens": {"type": "uniform", "low": 2, "high": 6},
        "num_requests": num_requests,
    }
    spec.update(workload)
    return scenario_dict(workload=spec)


def make_scenario(num_requests: int = 40, rate: float = 200.0, **workload: Any) -> Scenario:
    return parse_scenario(scenario_spec(num_requests, rate, **workload))


def run(
    scenario: Scenario,
    url: str,
    out: Path,
    *,
    resume: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> LiveResult:
    requests = scenario_requests(scenario)
    resume_from = read_resume(out, scenario, requests) if resume else None
    return run_live(
        scenario,
        Target(url, "tiny"),
        PromptTokens(VOCAB),
        out_dir=out,
        options=OPTIONS,
        resume_from=resume_from,
        progress=progress,
    )


def file_rows(out: Path) -> list[dict[str, Any]]:
    lines = (out / "records.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def lines_by_id(out: Path) -> dict[int, str]:
    lines = (out / "records.jsonl").read_text().splitlines()
    return {json.loads(line)["request_id"]: line for line in lines}


def sent_ids(server: FaultServer, requests: list[Request]) -> list[int]:
    """The workload requests the server received (warm-ups left out), by their prompts."""
    tokens = PromptTokens(VOCAB)
    by_prompt = {tuple(tokens.prompt_ids(r)): r.request_id for r in requests}
    warmups = {tuple(tokens.stream(-(i + 1), 32)) for i in range(WARMUP)}
    prompts = [tuple(r.body["prompt"]) for r in server.requests if "prompt" in r.body]
    assert all(p in by_prompt or p in warmups for p in prompts)
    return sorted(by_prompt[p] for p in prompts if p in by_prompt)


def num_workload_requests(server: FaultServer) -> int:
    warmups = {tuple(PromptTokens(VOCAB).stream(-(i + 1), 32)) for i in range(WARMUP)}
    prompts = [tuple(r.body["prompt"]) for r in server.requests if "prompt" in r.body]
    return sum(p not in warmups for p in prompts)


def write_records(
    out: Path, scenario: Scenario, statuses: dict[int, RequestStatus], *, meta: bool = True
) -> list[Request]:
    """A records file as an interrupted run leaves it: one line per id in ``statuses``."""
    requests = scenario_requests(scenario)
    out.mkdir(parents=True, exist_ok=True)
    if meta:
        (out / RECORDS_META_FILE).write_text(json.dumps(records_meta(scenario, requests)))
    lines = []
    for request in requests:
        status = statuses.get(request.request_id)
        if status is None:
            continue
        record = Record(
            request.request_id, request.arrival_s, request.prompt_tokens, request.output_tokens
        )
        record.status = status
        if status == RequestStatus.OK:
            record.first_token_s = request.arrival_s + 0.01
            record.finish_s = request.arrival_s + 0.02
        else:
            record.error = f"{status} in the earlier run"
        lines.append(json.dumps(record.as_row(), allow_nan=True) + "\n")
    (out / "records.jsonl").write_text("".join(lines))
    return requests


# -- resuming ----------------------------------------------------------------------------------
def test_an_interrupted_run_resumes_sending_only_what_did_not_complete(
    server: FaultServer, tmp_path: Path
) -> None:
    scenario = make_scenario(num_requests=40)
    requests = scenario_requests(scenario)
    server.dies_after = WARMUP + 15
    first = run(scenario, server.url("dies"), tmp_path)
    statuses = [r.status for r in first.replay.records]
    assert first.summary["live"]["interrupted"]
    assert statuses.count(RequestStatus.OK) == 15
    assert RequestStatus.ERROR in statuses and RequestStatus.CANCELLED in statuses
    assert sorted(row["request_id"] for row in file_rows(tmp_path)) == list(range(40))
    completed = {r.request_id for r in first.replay.records if r.status == RequestStatus.OK}
    before = lines_by_id(tmp_path)

    server.requests.clear()
    second = run(scenario, server.url("normal"), tmp_path, resume=True)
    # Exactly the requests that did not complete were sent, each once.
    assert sent_ids(server, requests) == sorted(set(range(40)) - completed)
    rows = file_rows(tmp_path)
    assert sorted(row["request_id"] for row in rows) == list(range(40))
    assert all(row["status"] == "ok" for row in rows)
    after = lines_by_id(tmp_path)
    assert all(after[i] == before[i] for i in completed)  # kept byte for byte
    assert second.summary["requests"]["ok"] == 40
    assert second.summary["live"]["resume"] == {"resumed": True, "reused": 15, "sent": 25}
    assert not second.summary["live"]["interrupted"]
    assert len(second.records) == 40

    # A finished run resumed again sends nothing and changes nothing.
    server.requests.clear()
    third = run(scenario, server.url("normal"), tmp_path, resume=True)
    assert num_workload_requests(server) == 0
    assert third.summary["live"]["resume"] == {"resumed": True, "reused": 40, "sent": 0}
    assert lines_by_id(tmp_path) == after


def test_ok_and_rejected_records_are_kept_everything_else_is_sent_again(
    server: FaultServer, tmp_path: Path
) -> None:
    scenario = make_scenario(num_requests=12)
    statuses = dict.fromkeys(range(12), RequestStatus.OK)
    statuses.update(
        {
            0: RequestStatus.REJECTED,
            1: RequestStatus.ERROR,
            2: RequestStatus.TIMEOUT,
            3: RequestStatus.CANCELLED,
        }
    )
    del statuses[4]  # no record at all: the run was killed before writing it
    requests = write_records(tmp_path, scenario, statuses)
    before = lines_by_id(tmp_path)

    result = run(scenario, server.url("normal"), tmp_path, resume=True)
    assert sent_ids(server, requests) == [1, 2, 3, 4]
    after = lines_by_id(tmp_path)
    assert sorted(after) == list(range(12))
    kept = [0, *range(5, 12)]
    assert all(after[i] == before[i] for i in kept)
    assert json.loads(after[0])["status"] == "rejected"
    assert all(json.loads(after[i])["status"] == "ok" for i in range(1, 12))
    assert result.summary["requests"]["rejected"] == 1
    assert result.summary["live"]["resume"] == {"resumed": True, "reused": 8, "sent": 4}


def test_resumed_requests_keep_their_schedule_shifted_to_start_at_once(
    server: FaultServer, tmp_path: Path
) -> None:
    scenario = make_scenario(num_requests=20, rate=5.0)
    requests = write_records(tmp_path, scenario, dict.fromkeys(range(15), RequestStatus.OK))
    remaining = [r for r in requests if r.request_id >= 15]
    first_s = remaining[0].arrival_s
    span_s = remaining[-1].arrival_s - first_s
    assert first_s > 2.0  # long enough that waiting for it would show

    result = run(scenario, server.url("normal"), tmp_path, resume=True)
    assert result.replay.duration_s < span_s + 1.0
    by_id = {r.request_id: r for r in result.replay.records}
    for request in remaining:
        # On the workload's timeline: the arrival time it was scheduled at, plus send lag.
        assert by_id[request.request_id].arrival_s == pytest.approx(request.arrival_s, abs=0.1)


def test_later_turns_of_kept_sessions_are_still_sent(server: FaultServer, tmp_path: Path) -> None:
    multi_turn = {"type": "multi_turn", "turns": {"type": "constant", "value": 3}}
    scenario = make_scenario(
        num_requests=24, rate=50.0, prefix={**multi_turn, "think_time_s": 0.01}
    )
    requests = scenario_requests(scenario)
    assert any(r.parent_id >= 0 for r in requests)
    server.dies_after = WARMUP + 10
    first = run(scenario, server.url("dies"), tmp_path)
    ok = {r.request_id for r in first.replay.records if r.status == RequestStatus.OK}
    assert len(ok) == 10
    # Some later turn must wait for an earlier turn that is kept, or the test proves nothing.
    assert any(r.parent_id in ok and r.request_id not in ok for r in requests)

    server.requests.clear()
    second = run(scenario, server.url("normal"), tmp_path, resume=True)
    assert num_workload_requests(server) == 24 - len(ok)
    rows = file_rows(tmp_path)
    assert sorted(row["request_id"] for row in rows) == list(range(24))
    assert all(row["status"] == "ok" for row in rows)
    assert second.summary["live"]["resume"]["sent"] == 24 - len(ok)


def test_a_half_written_last_line_is_ignored_and_its_request_sent_again(
    server: FaultServer, tmp_path: Path
) -> None:
    scenario = make_scenario(num_requests=10)
    requests = write_records(tmp_path, scenario, dict.fromkeys(range(10), RequestStatus.OK))
    text = (tmp_path / "records.jsonl").read_text()
    last = text.splitlines()[-1]
    (tmp_path / "records.jsonl").write_text(text[: -len(last) // 2])  # killed mid-write
    cut_id = json.loads(last)["request_id"]

    with pytest.warns(RecordsFileWarning, match=r"records\.jsonl:10: ignored a half-written"):
        result = run(scenario, server.url("normal"), tmp_path, resume=True)
    assert sent_ids(server, requests) == [cut_id]
    rows = file_rows(tmp_path)
    assert sorted(row["request_id"] for row in rows) == list(range(10))
    assert any("half-written" in note for note in result.summary["live"]["notes"])


def test_a_fresh_run_replaces_the_records_and_writes_the_meta_file(
    server: FaultServer, tmp_path: Path
) -> None:
    scenario = make_scenario(num_requests=5)
    write_records(tmp_path, scenario, dict.fromkeys(range(5), RequestStatus.ERROR), meta=False)
    result = run(scenario, server.url("normal"), tmp_path)
    assert [row["status"] for row in file_rows(tmp_path)] == ["ok"] * 5
    meta = json.loads((tmp_path / RECORDS_META_FILE).read_text())
    assert meta == records_meta(scenario, scenario_requests(scenario))
    assert result.summary["live"]["resume"] == {"resumed": False, "reused": 0, "sent": 5}


# -- refusals ----------------------------------------------------------------------------------
def corrupt_middle_line(out: Path) -> None:
    lines = (out / "records.jsonl").read_text().splitlines(keepends=True)
    lines[2] = lines[2][:20] + "\n"
    (out / "records.jsonl").write_text("".join(lines))


def add_line(out: Path, **fields: Any) -> None:
    row = json.loads((out / "records.jsonl").read_text().splitlines()[0])
    row.update(fields)
    with (out / "records.jsonl").open("a") as file:
        file.write(json.dumps(row) + "\n")


#: A way to break a records directory, and what the refusal must say.
BROKEN: dict[str, tuple[Any, str]] = {
    "no records file": (
        lambda out: (out / "records.jsonl").unlink(),
        r"no records file at .*records\.jsonl: nothing to resume",
    ),
    "no meta file": (
        lambda out: (out / RECORDS_META_FILE).unlink(),
        r"records\.meta\.json is missing, so the records .* cannot be checked",
    ),
    "another scenario": (
        lambda out: (out / RECORDS_META_FILE).write_text(
            json.dumps(records_meta(make_scenario(rate=7.0), scenario_requests(make_scenario())))
        ),
        r"records in .*records\.jsonl are from another scenario",
    ),
    "unknown request id": (
        lambda out: add_line(out, request_id=999),
        r"records\.jsonl:7: request id 999 is not in this workload's 8 requests",
    ),
    "another prompt length": (
        lambda out: add_line(out, request_id=7, prompt_tokens=10_000),
        r"records\.jsonl:7: request 7 has 10000 prompt tokens",
    ),
    "duplicate request id": (
        lambda out: add_line(out),
        r"records\.jsonl:7: request id 0 already has a record \(line 1\)",
    ),
    "corrupt line before the last": (
        corrupt_middle_line,
        r"records\.jsonl:3: not a record",
    ),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_records_that_cannot_be_resumed_are_refused(case: str, tmp_path: Path) -> None:
    scenario = make_scenario(num_requests=8)
    requests = write_records(tmp_path, scenario, dict.fromkeys(range(6), RequestStatus.OK))
    breaks, message = BROKEN[case]
    breaks(tmp_path)
    with pytest.raises(RecordsFileError, match=message):
        read_resume(tmp_path, scenario, requests)


@pytest.mark.parametrize("case", ["no records file", "another scenario", "unknown request id"])
def test_the_cli_refuses_with_one_line_and_exit_code_2(case: str, tmp_path: Path) -> None:
    scenario = make_scenario(num_requests=8)
    write_records(tmp_path / "out", scenario, dict.fromkeys(range(6), RequestStatus.OK))
    breaks, message = BROKEN[case]
    breaks(tmp_path / "out")
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(scenario_spec(num_requests=8)))
    # Nothing listens on this URL: the refusal must come before any server is contacted.
    command = ["live", "run", str(path), "--url", "http://127.0.0.1:9", "--vocab-size", "1000"]
    result = CliRunner().invoke(app, [*command, "--out", str(tmp_path / "out"), "--resume"])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    text = " ".join(result.output.split())  # rich wraps long lines; the message is one line
    assert text.startswith("error: --resume: ")
    assert text.endswith("run without --resume to start a fresh run")
    assert re.search(message, text)


def test_read_records_alone_needs_no_meta_file(tmp_path: Path) -> None:
    scenario = make_scenario(num_requests=4)
    requests = write_records(tmp_path, scenario, {0: RequestStatus.OK}, meta=False)
    records = read_records(tmp_path / "records.jsonl", requests)
    assert list(records.kept()) == [0]
    assert math.isclose(records.records_by_id[0].first_token_s, requests[0].arrival_s + 0.01)


def test_the_failures_are_summarised_with_their_reasons(
    server: FaultServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A server that answers a few requests and then drops every connection (the "dies" mode):
    # every request has a record, and the reasons are summarised with counts.
    server.dies_after = WARMUP + 5
    result = run(make_scenario(num_requests=20, rate=20), server.url("dies"), tmp_path)
    records = result.records
    assert len(records) == 20
    num_failed = int((records["status"] != "ok").sum())
    assert num_failed > 0
    _print_failures(records)
    text = " ".join(capsys.readouterr().err.split())
    assert f"{num_failed} requests did not complete:" in text
    reason = records.loc[records["status"] != "ok", "error"].iloc[0][:40]
    assert " ".join(reason.split()) in text


def test_a_resumed_run_sends_its_prompts_with_the_salt_it_started_with(tmp_path: Path) -> None:
    # A fresh run gets a fresh salt (a repeat must not hit the last run's prefix cache); a
    # resume keeps the recorded one, so later turns still hit what the earlier ones cached.
    import typer

    from live.cli import _prompt_salt_or_exit
    from live.run import recorded_salt

    scenario = parse_scenario(scenario_dict())
    requests = scenario_requests(scenario)
    assert recorded_salt(tmp_path) == 0  # nothing recorded: the scenario's own tokens
    (tmp_path / RECORDS_META_FILE).write_text(json.dumps(records_meta(scenario, requests, 42)))
    assert recorded_salt(tmp_path) == 42
    assert _prompt_salt_or_exit(None, tmp_path) == 42
    assert _prompt_salt_or_exit(42, tmp_path) == 42
    with pytest.raises(typer.Exit):
        _prompt_salt_or_exit(7, tmp_path)
    with pytest.raises(typer.Exit):
        _prompt_salt_or_exit(-1, None)
    assert _prompt_salt_or_exit(5, None) == 5
    fresh = {_prompt_salt_or_exit(None, None) for _ in range(5)}
    assert len(fresh) == 5 and min(fresh) > 0


def test_progress_counts_each_request_as_it_ends(server: FaultServer, tmp_path: Path) -> None:
    """The live run's progress bar: one call per ended request, kept ones counted as done."""
    scenario = make_scenario(12)
    calls: list[tuple[int, int]] = []

    def progress(done: int, total: int) -> None:
        calls.append((done, total))

    run(scenario, server.url("normal"), tmp_path / "a", progress=progress)
    assert calls == [(done, 12) for done in range(1, 13)]
    write_records(tmp_path / "b", scenario, {0: RequestStatus.OK, 1: RequestStatus.ERROR})
    calls.clear()
    run(scenario, server.url("normal"), tmp_path / "b", resume=True, progress=progress)
    assert calls == [(done, 12) for done in range(2, 13)]
