"""Launching, checking and stopping a vLLM server (live/server.py), and scraping it.

The first tests need no vLLM: they check the flag mapping, and the process-group handling with
stand-in server processes. The live tests start at most two real servers on the tiny model (one
that serves, one that cannot start), about 30-40 s each on two CPU cores.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from live.client import stream_completion as live_stream_completion
from live.scrape import metrics_delta, scrape
from live.server import (
    CPU_MULTIPROCESSING_VAR,
    EndpointError,
    ServerStartError,
    VLLMServer,
    attach,
    cpu_compute_threads,
    free_port,
    group_members,
)
from sim.scenario import EngineSpec
from sim.serve_flags import vllm_serve_args
from tests.live.conftest import TEST_MARK_VAR, marked_processes, wait_until_gone

httpx = pytest.importorskip("httpx")


def flag_value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


# -- flags ------------------------------------------------------------------------------------
def test_every_engine_knob_becomes_its_vllm_flag() -> None:
    engine = EngineSpec(
        max_num_seqs=8,
        max_num_batched_tokens=1024,
        block_size=32,
        enable_prefix_caching=False,
        enable_chunked_prefill=False,
        gpu_memory_utilization=0.5,
        max_model_len=2048,
        tensor_parallel_size=2,
        scheduling_policy="priority",
    )
    args = vllm_serve_args("org/model", engine, served_model_name="m", enforce_eager=True)
    assert flag_value(args, "--model") == "org/model"
    assert flag_value(args, "--dtype") == "bfloat16"
    assert flag_value(args, "--max-num-seqs") == "8"
    assert flag_value(args, "--max-num-batched-tokens") == "1024"
    assert flag_value(args, "--block-size") == "32"
    assert "--no-enable-prefix-caching" in args
    assert "--no-enable-chunked-prefill" in args
    assert flag_value(args, "--gpu-memory-utilization") == "0.5"
    assert flag_value(args, "--max-model-len") == "2048"
    assert flag_value(args, "--tensor-parallel-size") == "2"
    assert flag_value(args, "--scheduling-policy") == "priority"
    assert flag_value(args, "--served-model-name") == "m"
    assert "--enforce-eager" in args
    assert "--port" not in args
    assert "--host" not in args


def test_defaults_and_cpu_flags() -> None:
    args = vllm_serve_args("m", EngineSpec(block_size=32), cpu=True, extra_args=["--seed", "1"])
    assert "--enable-prefix-caching" in args
    assert "--enable-chunked-prefill" in args
    assert "--gpu-memory-utilization" not in args  # the CPU backend sizes its KV cache by env
    assert "--max-model-len" not in args  # None: the model's own maximum
    assert "--enforce-eager" not in args and "--no-enforce-eager" not in args
    assert args[-2:] == ["--seed", "1"]
    assert flag_value(vllm_serve_args("m", EngineSpec()), "--block-size") == "16"


def test_a_one_worker_cpu_server_keeps_the_model_in_the_engine_core(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv(CPU_MULTIPROCESSING_VAR, raising=False)

    def env_of(engine: EngineSpec, **kwargs: Any) -> dict[str, str]:
        return VLLMServer("m", engine, log_path=tmp_path / "log", cpu=True, **kwargs).env

    assert env_of(EngineSpec(block_size=32))[CPU_MULTIPROCESSING_VAR] == "0"
    # Several workers need vLLM's multiprocess executor; the caller's setting always wins.
    tp2 = env_of(EngineSpec(block_size=32, tensor_parallel_size=2), env={})
    assert CPU_MULTIPROCESSING_VAR not in tp2
    chosen = env_of(EngineSpec(block_size=32), env={CPU_MULTIPROCESSING_VAR: "1"})
    assert chosen[CPU_MULTIPROCESSING_VAR] == "1"
    gpu = VLLMServer("m", EngineSpec(), log_path=tmp_path / "log", cpu=False, env={}).env
    assert CPU_MULTIPROCESSING_VAR not in gpu
    # No worker process binds the compute threads then: one core is left to the front end.
    assert env_of(EngineSpec(block_size=32))["OMP_NUM_THREADS"] == str(cpu_compute_threads())
    assert cpu_compute_threads() == max(1, len(os.sched_getaffinity(0)) - 1)
    assert "OMP_NUM_THREADS" not in tp2


def test_knobs_a_vllm_server_cannot_honour_are_errors() -> None:
    with pytest.raises(ValueError, match=r"engine\.batching"):
        vllm_serve_args("m", EngineSpec(batching="static"))
    with pytest.raises(ValueError, match=r"engine\.block_size.*multiple of 32"):
        vllm_serve_args("m", EngineSpec(block_size=16), cpu=True)


# -- process handling with stand-in servers ----------------------------------------------------
#: Answers 200 on /health and lists one model, like a healthy vLLM server.
FAKE_SERVER = """
import http.server, json, sys
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"data": [{"id": "fake"}]}).encode() if self.path == "/v1/models" else b""
        self.send_response(200 if self.path in ("/health", "/v1/models") else 404)
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""

#: Starts a child that ignores SIGTERM (as a hung engine core might), then never gets healthy.
STUBBORN_SERVER = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
print("starting up", flush=True)
time.sleep(600)
"""

#: Fails the way vLLM does when it loses the race for its port.
PORT_TAKEN_SERVER = """
import sys
print("OSError: [Errno 98] error while attempting to bind on address "
      "('127.0.0.1', " + sys.argv[1] + "): address already in use", flush=True)
sys.exit(1)
"""


def stand_in(script: str, tmp_path: Path, startup_timeout_s: float = 20) -> VLLMServer:
    server = VLLMServer(
        "stand-in",
        EngineSpec(block_size=32),
        log_path=tmp_path / "server.log",
        startup_timeout_s=startup_timeout_s,
        cpu=True,
    )
    server.command = [sys.executable, "-c", script, str(server.port)]
    return server


def test_start_attach_and_stop_a_healthy_server(tmp_path: Path, no_orphans: str) -> None:
    with stand_in(FAKE_SERVER, tmp_path) as server:
        assert server.alive()
        assert attach(server.url) == "fake"
        assert attach(server.url + "/v1/") == "fake"
        pgid = server.pid
        assert pgid is not None and group_members(pgid) == [pgid]
    assert not server.alive()
    assert group_members(pgid) == []
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)
    assert server.process is not None
    assert server.stop() == server.process.returncode  # idempotent


def test_body_raising_still_stops_the_server(tmp_path: Path, no_orphans: str) -> None:
    server = stand_in(FAKE_SERVER, tmp_path)
    with pytest.raises(RuntimeError, match="boom"), server:
        raise RuntimeError("boom")
    assert server.pid is not None and group_members(server.pid) == []


def test_timeout_kills_the_whole_group_and_quotes_the_log(tmp_path: Path, no_orphans: str) -> None:
    server = stand_in(STUBBORN_SERVER, tmp_path, startup_timeout_s=2)
    start = time.monotonic()
    with pytest.raises(ServerStartError, match="not healthy after 2 s") as caught:
        server.start()
    assert time.monotonic() - start < 20
    assert "starting up" in caught.value.log_tail
    assert "starting up" in str(caught.value)
    assert caught.value.exit_code is not None
    assert server.pid is not None and group_members(server.pid) == []


def test_port_lost_after_launch_is_reported_with_the_port(tmp_path: Path, no_orphans: str) -> None:
    server = stand_in(PORT_TAKEN_SERVER, tmp_path)
    with pytest.raises(ServerStartError, match=f"port {server.port} .* already in use") as caught:
        server.start()
    assert caught.value.exit_code == 1
    assert caught.value.first_error is not None
    assert caught.value.first_error.startswith("OSError: [Errno 98]")


def test_port_in_use_is_refused_before_launch(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = VLLMServer("m", EngineSpec(block_size=32), port=port, log_path=tmp_path / "log")
        with pytest.raises(ServerStartError, match=f"port {port} .*already in use"):
            server.start()
    assert server.process is None


#: Leaves a grandchild behind in a session of its own, then exits: an orphan in the making.
ORPHANING_PARENT = """
import subprocess, sys
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
"""


def test_the_orphan_check_finds_a_process_whose_parent_is_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The no_orphans fixture relies on marked_processes: it must see an orphan that left the
    # test's process tree and group, or every orphan check would pass vacuously.
    mark = f"self-test-{uuid.uuid4().hex}"
    monkeypatch.setenv(TEST_MARK_VAR, mark)
    subprocess.run([sys.executable, "-c", ORPHANING_PARENT], check=True, timeout=60)
    left = marked_processes(mark)
    try:
        assert len(left) == 1
        (pid,) = left
        assert os.getpgid(pid) != os.getpgid(0)
    finally:
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    assert wait_until_gone(mark) == {}


def test_attach_to_nothing_is_a_clear_error() -> None:
    with pytest.raises(EndpointError, match="cannot reach"):
        attach(f"http://127.0.0.1:{free_port()}", timeout_s=2)


# -- a real vLLM server --------------------------------------------------------------------
#: Small enough for one CPU core; block size 32 because the CPU backend needs a multiple of 32.
ENGINE = EngineSpec(max_num_seqs=8, max_num_batched_tokens=2048, block_size=32, max_model_len=2048)
#: Prompt token ids above the 256 single-byte tokens, so every id decodes to whole characters.
PROMPT = list(range(300, 380))
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def real_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    from live.tiny_model import ensure_tiny_model

    server = VLLMServer(
        str(ensure_tiny_model()),
        ENGINE,
        log_path=tmp_path_factory.mktemp("vllm") / "server.log",
        served_model_name="tiny",
        # A mark of its own: shared by several tests, it is checked when it is stopped.
        env={TEST_MARK_VAR: f"real-server-{uuid.uuid4().hex}"},
    )
    started = time.monotonic()
    server.start()
    print(f"vLLM server healthy after {time.monotonic() - started:.1f} s")
    try:
        yield server
    finally:
        server.stop()


def stream_completion(
    url: str, prompt: list[int], max_tokens: int
) -> tuple[list[int], dict[str, Any]]:
    """Stream one completion; return the generated token ids and the usage block."""
    body = {
        "model": "tiny",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
        "return_token_ids": True,
        "stream_options": {"include_usage": True},
    }
    token_ids: list[int] = []
    usage: dict[str, Any] = {}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data: "))
            for choice in chunk["choices"]:
                token_ids += choice.get("token_ids") or []
            usage = chunk.get("usage") or usage
    return token_ids, usage


@pytest.mark.live
def test_real_server_is_healthy_and_named(real_server: VLLMServer) -> None:
    assert real_server.alive()
    assert httpx.get(f"{real_server.url}/health", timeout=5).status_code == 200
    assert attach(real_server.url) == "tiny" == real_server.model_name


@pytest.mark.live
def test_streamed_completions_show_up_in_the_metrics(real_server: VLLMServer) -> None:
    before = scrape(real_server.url)
    first, usage = stream_completion(real_server.url, PROMPT, MAX_TOKENS)
    assert len(first) == MAX_TOKENS
    assert usage == {
        "prompt_tokens": len(PROMPT),
        "completion_tokens": MAX_TOKENS,
        "total_tokens": len(PROMPT) + MAX_TOKENS,
        # The server runs with --enable-prompt-tokens-details: a fresh prompt has no hits.
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    second, second_usage = stream_completion(real_server.url, PROMPT, MAX_TOKENS)
    # The same prompt again: its full blocks come from the prefix cache, and usage says so.
    block = real_server.engine.block_size
    expected_cached = (len(PROMPT) - 1) // block * block
    assert second_usage["prompt_tokens_details"] == {"cached_tokens": expected_cached}
    assert len(second) == MAX_TOKENS
    deadline = time.monotonic() + 10
    while True:  # the engine's stats may trail the last streamed chunk a little
        delta = metrics_delta(before, scrape(real_server.url))
        if delta.e2e.count >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert delta.prompt_tokens == 2 * len(PROMPT)
    assert delta.generation_tokens == 2 * MAX_TOKENS
    assert delta.ttft.count == 2
    assert delta.e2e.count == 2
    # The repeat hits the prompt's two full 32-token blocks; the 16-token tail is recomputed.
    assert delta.prefix_cache_queries == 2 * len(PROMPT)
    assert delta.prefix_cache_hits == 64
    assert delta.preemptions == 0


@pytest.mark.live
def test_tokens_stream_as_they_are_generated(real_server: VLLMServer) -> None:
    """Each decode step's token leaves the server when it is made, not with the last one: the
    stream that calibration reads step times from. (With vLLM's CPU worker process behind a
    spinning engine core, whole streams arrived in one burst on 2 cores; see
    ``CPU_MULTIPROCESSING_VAR``.)"""

    async def arrivals() -> list[list[float]]:
        async with httpx.AsyncClient() as client:
            return [
                (
                    await live_stream_completion(
                        client,
                        real_server.url,
                        real_server.model_name,
                        [300 + (index * 7 + i) % 700 for i in range(64)],
                        40,
                    )
                ).token_times_s
                for index in range(16)
            ]

    for index, times in enumerate(asyncio.run(arrivals())):
        assert len(times) == 40
        # Token by token, or a few merged by the client's reads: never one burst.
        assert len(set(times)) >= 16, (index, times)


@pytest.mark.live
def test_stop_leaves_no_process_of_the_group(real_server: VLLMServer) -> None:
    pgid = real_server.pid
    assert pgid is not None
    assert len(group_members(pgid)) >= 2  # the API server and vLLM's engine core, at least
    mark = real_server.env[TEST_MARK_VAR]
    assert len(marked_processes(mark)) >= 2
    exit_code = real_server.stop()
    assert exit_code is not None
    assert group_members(pgid) == []
    # Nothing it started survives in any process group (the engine core included).
    assert wait_until_gone(mark) == {}
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)
    assert real_server.stop() == exit_code


@pytest.mark.live
def test_a_server_that_cannot_start_raises_with_its_log(tmp_path: Path, no_orphans: str) -> None:
    server = VLLMServer(
        str(tmp_path / "no-such-model"),
        ENGINE,
        log_path=tmp_path / "server.log",
        env={"HF_HUB_OFFLINE": "1"},
        startup_timeout_s=240,
    )
    with pytest.raises(ServerStartError, match="exited during startup") as caught:
        server.start()
    assert caught.value.exit_code not in (None, 0)
    assert caught.value.log_tail
    assert str(tmp_path / "server.log") in str(caught.value)
    assert server.pid is not None and group_members(server.pid) == []
