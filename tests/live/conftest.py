"""A real vLLM server on 127.0.0.1 for the live tests, started once per session and stopped after.

The server runs the tiny local model (random weights, local tokenizer) on vLLM's CPU backend, or
on the GPU where one is present. Every test here is marked ``live``.

Tests that start or kill servers take the ``no_orphans`` fixture: it marks every process the test
starts through an environment variable (children inherit it and keep it after their parent dies,
whatever their process group), and fails the test if a marked process is still running after it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
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


#: Set to a fresh value for each test that takes ``no_orphans``; every process the test starts
#: inherits it. Long-lived shared servers set it to "" so they are never taken for orphans.
TEST_MARK_VAR = "SERVESIM_TEST_PROCESS_MARK"
#: How long processes the test started may take to exit after it (zombies are not counted).
ORPHAN_GRACE_S = 15.0


def marked_processes(mark: str) -> dict[int, str]:
    """Running processes (not zombies) whose environment has ``TEST_MARK_VAR=mark``: pid → command.

    Read from ``/proc``; processes of other users (unreadable environment) are skipped.
    """
    needle = f"{TEST_MARK_VAR}={mark}".encode()
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:  # exited meanwhile, or not ours to read
            continue
        state = stat.rsplit(")", 1)[-1].split()[0]  # the command name may hold spaces
        if state not in ("Z", "X") and needle in environ.split(b"\0"):
            found[int(entry.name)] = cmdline.replace(b"\0", b" ").decode(errors="replace").strip()
    return found


def wait_until_gone(mark: str, timeout_s: float = ORPHAN_GRACE_S) -> dict[int, str]:
    """Wait up to ``timeout_s`` for the processes marked ``mark`` to exit; return those left."""
    deadline = time.monotonic() + timeout_s
    left = marked_processes(mark)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = marked_processes(mark)
    return left


@pytest.fixture
def no_orphans(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Fail the test if a process it started (a vLLM server, its engine core, a CLI) outlives it.

    Yields the mark. Leftovers are killed (by pid) before the test fails, so they cannot disturb
    the tests after it.
    """
    if not Path("/proc/self/environ").exists():
        pytest.skip("the orphan check reads /proc (Linux only)")
    mark = f"{os.getpid()}-{uuid.uuid4().hex}"
    monkeypatch.setenv(TEST_MARK_VAR, mark)
    yield mark
    left = wait_until_gone(mark)
    if left:
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        listing = "; ".join(f"{pid}: {command[:200]}" for pid, command in left.items())
        pytest.fail(
            f"processes started by the test still ran {ORPHAN_GRACE_S:g} s after it: {listing}"
        )


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    from live.tiny_model import ensure_tiny_model

    return ensure_tiny_model()


@pytest.fixture(scope="session")
def vllm_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from live.server import VLLMServer

    log = tmp_path_factory.mktemp("vllm") / "server.log"
    server = VLLMServer(str(tiny_model_dir), LIVE_ENGINE, log_path=log, env={TEST_MARK_VAR: ""})
    server.start()
    try:
        yield server
    finally:
        server.stop()
