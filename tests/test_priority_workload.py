"""Request priorities from the scenario (``workload.priority``) and from traces."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sim.run import build, scenario_requests
from sim.scenario import ScenarioError, parse_scenario
from sim.workload.traces import read_trace
from tests.factories import scenario_dict

CLASSES = {"classes": [{"priority": 0, "share": 0.25}, {"priority": 5, "share": 0.75}]}


def prioritised(**workload: Any) -> dict[str, Any]:
    data = scenario_dict()
    data["engine"]["scheduling_policy"] = "priority"
    data["workload"].update({"num_requests": 400, "priority": CLASSES, **workload})
    return data


def test_classes_are_drawn_by_share_and_the_rest_of_the_workload_is_unchanged() -> None:
    with_classes = scenario_requests(parse_scenario(prioritised()))
    plain = prioritised()
    del plain["workload"]["priority"]
    without = scenario_requests(parse_scenario(plain))
    priorities = np.array([r.priority for r in with_classes])
    assert set(priorities) == {0, 5}
    assert np.mean(priorities == 0) == pytest.approx(0.25, abs=0.06)
    # Only the priority differs: arrivals, lengths and content are the same draws.
    for a, b in zip(with_classes, without, strict=True):
        assert (a.arrival_s, a.prompt_tokens, a.segments) == (
            b.arrival_s,
            b.prompt_tokens,
            b.segments,
        )


def test_a_session_keeps_one_class() -> None:
    prefix = {"type": "multi_turn", "turns": {"type": "constant", "value": 3}, "think_time_s": 1}
    requests = scenario_requests(parse_scenario(prioritised(prefix=prefix)))
    by_id = {r.request_id: r for r in requests}
    later = [r for r in requests if r.parent_id >= 0]
    assert later
    assert all(r.priority == by_id[r.parent_id].priority for r in later)


def test_the_served_first_class_waits_less_under_load_and_is_reported_apart() -> None:
    data = prioritised(arrival={"type": "poisson", "rate": 60})
    data["workload"]["prompt_tokens"] = {"type": "constant", "value": 2048}
    data["engine"]["max_num_seqs"] = 8
    result = build(parse_scenario(data)).run()
    assert set(result.records["priority"]) == {0, 5}
    classes = result.summary["by_priority"]
    assert classes["0"]["requests"] + classes["5"]["requests"] == 400
    assert classes["0"]["ttft_s"]["mean"] < classes["5"]["ttft_s"]["mean"]


def test_one_class_has_no_per_class_section() -> None:
    data = prioritised()
    data["workload"]["priority"] = {"classes": [{"priority": 3, "share": 1.0}]}
    summary = build(parse_scenario(data)).run().summary
    assert "by_priority" not in summary


@pytest.mark.parametrize(
    ("change", "hint"),
    [
        ({"classes": [{"priority": 0, "share": 0.5}]}, "sum to 1"),
        ({"classes": [{"priority": 1, "share": 0.5}, {"priority": 1, "share": 0.5}]}, "once"),
        ({"classes": []}, "classes"),
    ],
)
def test_bad_classes_name_the_field(change: dict[str, Any], hint: str) -> None:
    with pytest.raises(ScenarioError) as error:
        parse_scenario(prioritised(priority=change))
    message = "; ".join(error.value.problems)
    assert "workload.priority" in message and hint in message


def test_priorities_under_fcfs_are_refused_with_the_fix() -> None:
    data = prioritised()
    data["engine"]["scheduling_policy"] = "fcfs"
    with pytest.raises(ScenarioError, match="scheduling_policy: priority"):
        parse_scenario(data)


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_a_trace_carries_its_priorities(tmp_path: Path) -> None:
    rows = [
        {"arrival_s": 0.1 * i, "prompt_tokens": 64, "output_tokens": 8, "priority": i % 3}
        for i in range(30)
    ]
    trace = write_jsonl(tmp_path / "t.jsonl", rows)
    assert read_trace(trace).priorities is not None
    data = scenario_dict(workload={"trace": {"path": str(trace)}})
    data["engine"]["scheduling_policy"] = "priority"
    records = build(parse_scenario(data)).run().records
    assert records["priority"].tolist() == [i % 3 for i in range(30)]
    data["engine"]["scheduling_policy"] = "fcfs"
    with pytest.raises(ValueError, match=r"engine\.scheduling_policy"):
        build(parse_scenario(data))


def test_a_csv_trace_priority_column(tmp_path: Path) -> None:
    lines = ["arrival_s,prompt_tokens,output_tokens,priority"]
    lines += [f"{i * 0.5},32,4,{-i}" for i in range(4)]
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n")
    trace = read_trace(tmp_path / "t.csv")
    assert trace.priorities is not None and trace.priorities.tolist() == [0, -1, -2, -3]


def test_a_bad_priority_names_its_line_and_column(tmp_path: Path) -> None:
    rows = [{"arrival_s": 0, "prompt_tokens": 8, "output_tokens": 2, "priority": "high"}]
    with pytest.raises(ValueError, match="priority") as error:
        read_trace(write_jsonl(tmp_path / "t.jsonl", rows))
    assert "t.jsonl:1: field 'priority'" in str(error.value)


def test_trace_priorities_and_classes_together_are_refused(tmp_path: Path) -> None:
    rows = [
        {"arrival_s": i, "prompt_tokens": 8, "output_tokens": 2, "priority": 1} for i in range(3)
    ]
    trace = write_jsonl(tmp_path / "t.jsonl", rows)
    data = scenario_dict(workload={"trace": {"path": str(trace)}, "priority": CLASSES})
    data["engine"]["scheduling_policy"] = "priority"
    with pytest.raises(ValueError, match="its own priorities"):
        build(parse_scenario(data))
