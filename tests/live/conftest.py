"""A real vLLM server on 127.0.0.1 for the live tests, started once per session and stopped after.

The server runs the tiny local model (random weights, local tokenizer) on vLLM's CPU backend, or
on the GPU where one is present. Every test here is marked ``live``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sim.scenario import EngineSpec


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/live/" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.live)


#: Engine knobs of the shared server: small enough for one CPU core, prefix caching on. vLLM's
#: CPU backend needs a block size that is a multiple of 32.
LIVE_ENGINE = EngineSpec(
    block_size=32,
    max_num_seqs=32,
    max_num_batched_tokens=2048,
    max_model_len=2048,
    enable_prefix_caching=True,
)


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    from live.tiny_model import ensure_tiny_model

    return ensure_tiny_model()


@pytest.fixture(scope="session")
def vllm_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from live.server import VLLMServer

    log = tmp_path_factory.mktemp("vllm") / "server.log"
    server = VLLMServer(str(tiny_model_dir), LIVE_ENGINE, log_path=log)
    server.start()
    try:
        yield server
    finally:
        server.stop()
