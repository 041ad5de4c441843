"""The Streamlit planner, driven with streamlit.testing.v1.AppTest: every page renders without
exceptions, a changed knob changes the result, and bad input is an inline error."""

from __future__ import annotations

import ast
import base64
import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest
from streamlit.testing.v1.element_tree import Block, Tab, Widget

from dashboards.core import (
    MAX_SCENARIO_BYTES,
    default_data,
    parse_upload,
    parse_yaml_text,
    presets,
    store_trace,
)
from dashboards.state import SCENARIO

PAGES = Path(__file__).parents[1] / "dashboards" / "pages"
TIMEOUT = 60


def small(data: dict[str, Any] | None = None, **workload: Any) -> dict[str, Any]:
    data = copy.deepcopy(data or default_data())
    data["workload"]["num_requests"] = 200
    data["workload"].update(workload)
    return data


def page(name: str, data: dict[str, Any] | None = None) -> AppTest:
    app = AppTest.from_file(str(PAGES / f"{name}.py"), default_timeout=TIMEOUT)
    if data is not None:
        app.session_state[SCENARIO] = data
    return app.run()


def test_the_app_renders_with_navigation() -> None:
    app = AppTest.from_file(str(PAGES.parent / "app.py"), default_timeout=TIMEOUT).run()
    assert not app.exception
    assert app.title[0].value == "Scenario"


def test_scenario_page_renders_every_group() -> None:
    app = page("scenario", small())
    assert not app.exception
    tabs = [tab.label for tab in app.tabs]
    assert tabs == [
        "Model & GPU",
        "Workload",
        "Engine",
        "Fleet & autoscaling",
        "SLOs & cost",
        "YAML & trace",
    ]
    assert app.success and "Valid" in app.success[0].value


def test_results_page_shows_the_headline_cards() -> None:
    app = page("results", small())
    assert not app.exception
    labels = [metric.label for metric in app.metric]
    assert labels[:2] == ["TTFT p90", "TPOT p90"]
    assert {"SLO attainment", "Output tokens/s", "USD / M output tokens", "Prefix hit rate"} <= set(
        labels
    )


def test_results_page_shows_intervals_across_seeds() -> None:
    app = page("results", small(num_requests=100))
    app.number_input(key="replication_seeds").set_value(3)
    app.button(key="replication_run").click().run(timeout=120)
    assert not app.exception
    tables = [frame.value for frame in app.dataframe if "metric" in frame.value.columns]
    assert len(tables) == 1
    table = tables[0]
    assert list(table.columns) == ["metric", "mean", "± 95 %"]
    ttft = table.set_index("metric").loc["TTFT p90 (ms)"]
    assert ttft["mean"] > 0 and ttft["± 95 %"] > 0  # three seeds differ


def test_a_changed_knob_changes_the_result() -> None:
    app = page("scenario", small())
    app.number_input(key="rate").set_value(40.0).run()
    assert not app.exception
    busy = app.session_state[SCENARIO]
    assert busy["workload"]["arrival"]["rate"] == 40.0
    quiet = page("results", small())
    loaded = page("results", busy)
    ttft = {m.label: m.value for m in quiet.metric}["TTFT p90"]
    ttft_busy = {m.label: m.value for m in loaded.metric}["TTFT p90"]
    assert ttft != ttft_busy


def test_replicas_knob_reaches_the_fleet() -> None:
    app = page("scenario", small())
    app.number_input(key="replicas").set_value(3).run()
    result = page("results", app.session_state[SCENARIO])
    assert not result.exception
    throughput = {m.label: m.value for m in result.metric}["Output tokens/s"]
    assert throughput


def test_bad_pasted_yaml_is_an_inline_error() -> None:
    app = page("scenario", small())
    app.text_area(key="pasted_yaml").input("model: [unclosed").run()
    app.button(key="use_pasted").click().run()
    assert not app.exception
    assert any("not valid YAML" in error.value for error in app.error)
    app.text_area(key="pasted_yaml").input("model: llama-3.1-8b\ngpu: h100-sxm\n").run()
    app.button(key="use_pasted").click().run()
    assert any("workload" in error.value for error in app.error)


def test_an_invalid_scenario_is_reported_not_raised() -> None:
    data = small()
    data["workload"]["arrival"]["rate"] = -1
    for name in ("scenario", "results"):
        app = page(name, data)
        assert not app.exception
        assert any("workload.arrival.rate" in error.value for error in app.error)


def test_presets_are_valid_and_run() -> None:
    for name, data in presets().items():
        parsed = parse_yaml_text(yaml.safe_dump(small(data)), name)
        assert parsed.errors == [], (name, parsed.errors)


def test_uploads_are_capped_and_safe(tmp_path: Path) -> None:
    assert "larger than" in parse_upload(b"x" * (MAX_SCENARIO_BYTES + 1)).errors[0]
    assert "not UTF-8" in parse_upload(b"\xff\xfe\x00").errors[0]
    # safe_load: a Python object tag is rejected, never constructed.
    tagged = parse_upload(b"!!python/object/apply:os.system ['true']\n")
    assert tagged.scenario is None and "not valid YAML" in tagged.errors[0]
    bad, error = store_trace(b"prompt_tokens,output_tokens\nabc,3\n", ".csv", tmp_path)
    assert bad is None and "prompt_tokens" in error and str(tmp_path) not in error
    good, error = store_trace(b"prompt_tokens,output_tokens\n100,20\n", ".csv", tmp_path)
    assert error == "" and good is not None and good.parent == tmp_path
    assert good.name.startswith("trace-")  # named by content, never by the uploader
    _, error = store_trace(b"{}", ".exe", tmp_path)
    assert "csv" in error


def test_compare_page_shows_the_knobs_that_differ() -> None:
    from dashboards.state import SAVED

    quiet = small()
    busy = small()
    busy["workload"]["arrival"]["rate"] = 30
    app = AppTest.from_file(str(PAGES / "compare.py"), default_timeout=TIMEOUT)
    app.session_state[SAVED] = {"quiet": quiet, "busy": busy}
    app.run()
    assert not app.exception
    diff = app.dataframe[1].value
    assert list(diff.index) == ["workload.arrival.rate"]
    assert len(app.get("plotly_chart")) == 2


def test_compare_page_asks_for_two_scenarios() -> None:
    app = page("compare", small())
    assert not app.exception and "Save two or more" in app.info[0].value


def test_planner_page_finds_the_cheapest() -> None:
    data = small(num_requests=100)
    app = page("planner", data)
    assert not app.exception
    app.multiselect(key="plan_gpus").set_value(["h100-sxm"])
    app.multiselect(key="plan_tp").set_value([1])
    app.multiselect(key="plan_dt").set_value(["bf16"])
    app.number_input(key="plan_max").set_value(2)
    app.number_input(key="plan_requests").set_value(100)
    assert not app.success, "the search runs only when asked"
    app.button(key="plan_search").click().run(timeout=120)
    assert not app.exception
    assert app.success and "Cheapest meeting the SLOs" in app.success[0].value
    assert any("vllm serve" in block.value for block in app.code)
    assert widget_keys(app) == [
        "plan_gpus",
        "plan_tp",
        "plan_dt",
        "plan_max",
        "plan_requests",
        "plan_pd",
        "plan_search",
        "plan_break",
        "plan_k8s",
    ]


def planned(requests: int = 60) -> AppTest:
    """The planner page after one search over a small space."""
    app = page("planner", small(num_requests=requests))
    app.multiselect(key="plan_gpus").set_value(["h100-sxm"])
    app.multiselect(key="plan_tp").set_value([1])
    app.multiselect(key="plan_dt").set_value(["bf16"])
    app.number_input(key="plan_max").set_value(1)
    app.number_input(key="plan_requests").set_value(requests)
    return app.button(key="plan_search").click().run(timeout=120)


def test_planner_keeps_its_results_until_the_inputs_change() -> None:
    from dashboards.pages.planner import SEARCHES

    app = planned()
    assert app.success and len(app.session_state[SEARCHES]) == 1
    app.run()  # any other rerun: the same results, no new search
    assert app.success and len(app.session_state[SEARCHES]) == 1
    app.number_input(key="plan_max").set_value(2).run()
    assert not app.success and "press Search" in app.info[0].value
    assert len(app.session_state[SEARCHES]) == 1, "a changed widget alone does not search"
    app.number_input(key="plan_max").set_value(1).run()
    assert app.success, "the inputs of a search already run show its results again"


def test_planner_keeps_the_breaking_load_on_screen() -> None:
    app = planned()
    tables = len(app.dataframe)
    app.button(key="plan_break").click().run(timeout=180)
    assert not app.exception
    assert len(app.dataframe) == tables + 1
    assert list(app.dataframe[-1].value.columns) == ["candidate", "breaks above × rate"]
    app.run()
    assert len(app.dataframe) == tables + 1, "kept across a rerun"


def test_the_pareto_chart_leaves_out_candidates_without_a_ttft() -> None:
    """Every request rejected (prompts longer than max_model_len): the candidates ran but have
    no TTFT. The chart once drew them at 0 ms; now it names them and draws nothing for them."""
    data = small(num_requests=40)
    data["engine"]["max_model_len"] = 64
    data["workload"]["prompt_tokens"] = {"type": "constant", "value": 200}
    app = page("planner", data)
    app.multiselect(key="plan_gpus").set_value(["h100-sxm"])
    app.multiselect(key="plan_tp").set_value([1])
    app.multiselect(key="plan_dt").set_value(["bf16"])
    app.number_input(key="plan_max").set_value(1)
    app.number_input(key="plan_requests").set_value(40)
    app.button(key="plan_search").click().run(timeout=120)
    assert not app.exception
    assert any("Not drawn (no TTFT" in caption.value for caption in app.caption)
    figure = json.loads(app.get("plotly_chart")[0].proto.spec)
    (points,) = [trace for trace in figure["data"] if trace.get("name") == "candidates"]
    assert plotted(points.get("y")) == []


def plotted(data: Any) -> list[float]:
    """A trace's values as plotly writes them: a list, or typed base64 (``bdata``)."""
    if isinstance(data, dict):
        raw = base64.b64decode(data["bdata"])
        return [float(v) for v in np.frombuffer(raw, dtype=data["dtype"])]
    return [float(v) for v in data or []]


def test_calibration_page_shows_a_shipped_profile() -> None:
    app = page("profiles", small())
    assert not app.exception
    app.selectbox(key="profile_pick").set_value("h100-sxm_llama-3.1-8b_tp1.json").run()
    assert not app.exception
    labels = [m.label for m in app.metric]
    assert labels == ["fit error mean", "fit error p90", "points"]
    assert len(app.get("plotly_chart")) == 1


def test_export_page_writes_command_and_manifests() -> None:
    app = page("export", small())
    assert not app.exception
    blocks = [block.value for block in app.code]
    assert blocks[0].startswith("vllm serve meta-llama/Llama-3.1-8B")
    assert "kind: Deployment" in blocks[1]


def test_engine_and_arrival_knobs_reach_the_scenario() -> None:
    app = page("scenario", small())
    app.selectbox(key="arrival_type").set_value("gamma").run()
    app.number_input(key="arrival_cv").set_value(4.0).run()
    app.number_input(key="pp").set_value(2).run()
    app.selectbox(key="kv_dtype").set_value("fp8").run()
    assert not app.exception
    data = app.session_state[SCENARIO]
    assert data["workload"]["arrival"] == {"type": "gamma", "rate": 8.0, "cv": 4.0}
    assert data["engine"]["pipeline_parallel_size"] == 2
    assert data["kv_cache_dtype"] == "fp8"
    assert app.success and "Valid" in app.success[0].value


def test_closed_loop_knobs_reach_the_scenario_and_run() -> None:
    app = page("scenario", small())
    app.toggle(key="rate_inf").set_value(True).run()
    app.number_input(key="max_concurrency").set_value(16).run()
    app.number_input(key="think_time_s").set_value(0.5).run()
    assert not app.exception
    workload = app.session_state[SCENARIO]["workload"]
    assert workload["arrival"]["rate"] == float("inf")
    assert (workload["max_concurrency"], workload["think_time_s"]) == (16, 0.5)
    assert app.success and "Valid" in app.success[0].value
    app.number_input(key="max_concurrency").set_value(0).run()  # back to an open loop
    workload = app.session_state[SCENARIO]["workload"]
    assert "max_concurrency" not in workload and "think_time_s" not in workload
    results = page("results", app.session_state[SCENARIO])
    assert not results.exception


def test_values_outside_the_widgets_choices_are_kept_not_crashed() -> None:
    data = small()
    data["engine"]["tensor_parallel_size"] = 16  # valid, but not a select-box option
    data["model"] = "llama-3.1-405b"
    app = page("scenario", data)
    assert not app.exception
    assert app.session_state[SCENARIO]["engine"]["tensor_parallel_size"] == 16


def test_a_quantized_checkpoint_keeps_its_weights_dtype() -> None:
    data = small()
    data["model"] = "Qwen/Qwen3-8B-FP8"
    data.pop("dtype", None)
    app = page("scenario", data)
    assert not app.exception and not app.error
    assert app.session_state[SCENARIO]["dtype"] == "fp8"


def widget_keys(container: AppTest | Block) -> list[str | None]:
    """The widgets' keys in a page (or one of its blocks), top to bottom."""
    root = container.main if isinstance(container, AppTest) else container
    return [node.key for node in root if isinstance(node, Widget)]


def test_scenario_page_widgets_keep_their_tab_and_order() -> None:
    app = page("scenario", small())
    layout: list[Any] = []  # widget keys, and a {tab label: widget keys} for the tabs
    for node in app.main.children.values():
        if isinstance(node, Block) and node.type == "tab_container":
            tabs = [tab for tab in node.children.values() if isinstance(tab, Tab)]
            layout.append({tab.label: widget_keys(tab) for tab in tabs})
        elif isinstance(node, Widget):
            layout.append(node.key)
    assert layout == [
        "preset",
        {
            "Model & GPU": ["model", "gpu", "dtype"],
            "Workload": [
                *("arrival_type", "rate_inf", "rate", "max_concurrency"),
                *("p_mean", "p_p90", "o_mean", "o_p90", "num_requests"),
            ],
            "Engine": [
                *("seqs", "tp", "pp", "batched_tokens", "max_model_len", "block", "gmu"),
                *("caching", "chunked", "batching", "quantization", "kv_dtype"),
            ],
            "Fleet & autoscaling": ["replicas", "router", "hpa"],
            "SLOs & cost": ["slo_ttft", "slo_tpot", "slo_e2e", "slo_pct", "price"],
            "YAML & trace": ["save_yaml", "pasted_yaml", "use_pasted", "yaml_upload", "trace"],
        },
        "save_name",
        "save_compare",
    ]


def test_autoscaling_knobs_appear_when_it_is_on() -> None:
    app = page("scenario", small())
    app.toggle(key="hpa").set_value(True).run()
    assert not app.exception
    keys = widget_keys(app)
    assert keys[keys.index("hpa") :][:3] == ["hpa", "hpa_target", "hpa_max"]
    assert app.session_state[SCENARIO]["fleet"]["autoscaling"] == {
        "target": 500.0,
        "max_replicas": 10,
    }


def test_valid_pasted_yaml_replaces_the_scenario() -> None:
    app = page("scenario", small())
    pasted = small()
    pasted["model"] = "llama-3.1-70b"
    pasted["fleet"] = {"replicas": 7}
    app.text_area(key="pasted_yaml").input(yaml.safe_dump(pasted)).run()
    app.button(key="use_pasted").click().run()
    assert not app.exception
    assert any(success.value == "Loaded." for success in app.success)
    assert app.session_state[SCENARIO]["model"] == "llama-3.1-70b"
    # The knobs show the loaded values, and the next rerun keeps them.
    assert app.selectbox(key="model").value == "llama-3.1-70b"
    assert app.number_input(key="replicas").value == 7
    app.run()
    assert app.session_state[SCENARIO]["fleet"]["replicas"] == 7


def test_an_uploaded_scenario_is_loaded_once_and_edits_stick() -> None:
    app = page("scenario", small())
    uploaded = small()
    uploaded["gpu"] = "a100-80gb"
    content = yaml.safe_dump(uploaded).encode()
    app.file_uploader(key="yaml_upload").upload("s.yaml", content, "application/x-yaml").run()
    assert not app.exception
    assert app.session_state[SCENARIO]["gpu"] == "a100-80gb"
    # The file stays in its uploader; an edit made after it must not be undone on rerun.
    app.number_input(key="replicas").set_value(3).run()
    app.run()
    assert app.session_state[SCENARIO]["gpu"] == "a100-80gb"
    assert app.session_state[SCENARIO]["fleet"]["replicas"] == 3


def test_a_preset_replaces_the_knobs_values() -> None:
    app = page("scenario", small())
    app.number_input(key="replicas").set_value(5).run()
    app.selectbox(key="preset").set_value("Agentic").run()
    app.button(key="load_preset").click().run()
    assert not app.exception
    assert "Agentic" in app.success[0].value
    assert app.number_input(key="replicas").value == presets()["Agentic"]["fleet"]["replicas"]
    assert app.session_state[SCENARIO]["fleet"]["router"]["policy"] == "prefix_affinity"


@pytest.mark.parametrize(
    ("metric", "label"),
    [("ttft_ms", "Target p99 TTFT (ms)"), ("kv_usage", "Target KV cache usage (0–1)")],
)
def test_the_hpa_target_is_labelled_by_its_metric(metric: str, label: str) -> None:
    data = small()
    data["fleet"] = {"replicas": 1}
    data["fleet"]["autoscaling"] = {
        "target": 0.8 if metric == "kv_usage" else 500,
        "metric": metric,
        "percentile": 99,
    }
    app = page("scenario", data)
    assert not app.exception
    assert app.number_input(key="hpa_target").label == label


def test_the_gpu_price_is_kept_across_visits() -> None:
    app = page("scenario", small())
    app.number_input(key="price").set_value(3.5).run()
    gpu = app.session_state[SCENARIO]["gpu"]
    assert app.session_state[SCENARIO]["cost"] == {"gpu_hour_usd": {gpu: 3.5}}
    # Another visit (a fresh page run on the same scenario) shows the price, not 0.
    again = page("scenario", app.session_state[SCENARIO])
    assert again.number_input(key="price").value == 3.5
    again.number_input(key="price").set_value(0.0).run()
    assert "cost" not in again.session_state[SCENARIO]


#: The project's rule: no function over this many lines unless its docstring says why.
MAX_FUNCTION_LINES = 80


def test_dashboard_functions_stay_short() -> None:
    """One render function per page section keeps every page function short; a longer one
    must say in its docstring why it is long."""
    long = []
    for path in sorted(PAGES.parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES and not ast.get_docstring(node):
                    long.append(f"{path.name}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, long
