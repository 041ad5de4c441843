"""Launch a real vLLM server from a scenario's engine knobs, wait until it is healthy, stop it.

The server runs as ``sys.executable -m vllm.entrypoints.openai.api_server`` (the ``vllm``
console script is missing from the CPU build) in its own process group, with stdout and stderr
appended to a log file. vLLM spawns an engine-core child process, so stopping signals the whole
group: SIGTERM first, SIGKILL after a grace period, and no process of the group outlives
:meth:`VLLMServer.stop`. On a machine without CUDA the server runs on vLLM's CPU backend, which
sizes its KV cache from ``VLLM_CPU_KVCACHE_SPACE`` (GiB) instead of ``--gpu-memory-utilization``.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import importlib.util
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from live.client import base_url
from sim.scenario import EngineSpec
from sim.serve_flags import vllm_serve_args

#: The module that serves vLLM's OpenAI-compatible API (works for both the CUDA and CPU builds).
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
#: KV-cache size in GiB given to the CPU backend unless the caller's environment sets one.
DEFAULT_CPU_KVCACHE_SPACE_GIB = 1
#: Set to "0" for a one-worker CPU server (unless the caller's environment sets it): vLLM's CPU
#: backend then keeps the model in the engine-core process (the one-process executor a GPU
#: server uses at tensor parallelism 1) instead of a worker process behind a shared-memory
#: queue. That queue's reader, the engine core, spins on ``sched_yield`` while the worker runs a
#: step; on a 2-core machine (worker pinned to one core) the spin shares the other core with the
#: API server and the client, and we measured whole streams held back and delivered in one burst
#: when the request ended: 9 and 6 of 15 sequential requests on two fresh servers, 0 of 15 with
#: this set (3M tiny model, 41 output tokens, 2026-12-05). The one-process executor binds no
#: compute threads, so ``OMP_NUM_THREADS`` is set too (:func:`cpu_compute_threads`).
CPU_MULTIPROCESSING_VAR = "VLLM_ENABLE_V1_MULTIPROCESSING"
#: How long :meth:`VLLMServer.stop` waits for init to reap the group's orphaned zombies.
ZOMBIE_REAP_WAIT_S = 5.0
#: Lines of the server log quoted in a :class:`ServerStartError`.
LOG_TAIL_LINES = 30
_PORT_IN_USE_MARKERS = ("address already in use", f"[errno {errno.EADDRINUSE}]")


class ServerStartError(RuntimeError):
    """The server did not become healthy; the message quotes the exit code and the log tail."""

    def __init__(
        self,
        reason: str,
        *,
        exit_code: int | None,
        log_path: Path | None,
        log_tail: str,
        first_error: str | None = None,
    ) -> None:
        self.reason = reason
        self.exit_code = exit_code
        self.log_path = log_path
        self.log_tail = log_tail
        self.first_error = first_error
        lines = [reason, f"exit code: {exit_code}"]
        if first_error:
            # vLLM's root cause is usually far above the tail, under several re-raises.
            lines.append(f"first error in the log: {first_error}")
        if log_path is not None:
            lines.append(f"log: {log_path}")
        if log_tail:
            lines += [f"last {LOG_TAIL_LINES} lines of the log:", log_tail]
        super().__init__("\n".join(lines))


class EndpointError(RuntimeError):
    """An existing endpoint given to :func:`attach` is unreachable or not an OpenAI server."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that is free right now (another process may still take it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def port_in_use(host: str, port: int) -> bool:
    """Whether binding ``host:port`` fails, as it would for the server (which reuses addresses)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Like uvicorn, so a port merely in TIME_WAIT does not count as taken.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
        return False


def cuda_available() -> bool:
    """Whether torch is installed and sees a CUDA device (vLLM then uses its GPU backend)."""
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def cpu_compute_threads() -> int:
    """Compute threads for a one-process CPU server: every core this process may use but one."""
    return max(1, len(os.sched_getaffinity(0)) - 1)


class VLLMServer:
    """A vLLM OpenAI-compatible server process that this object starts and stops.

    Use as a context manager (``with VLLMServer(...) as server:``) or call :meth:`start` and
    :meth:`stop`. The server is stopped when the ``with`` body raises and, failing that, at
    interpreter exit. ``cpu`` None picks the CPU backend when there is no CUDA device: it then
    sets ``VLLM_CPU_KVCACHE_SPACE`` (unless the environment has one), ``--enforce-eager``, and
    for one worker the one-process executor (see :data:`CPU_MULTIPROCESSING_VAR`).
    """

    def __init__(
        self,
        model: str,
        engine: EngineSpec | None = None,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        log_path: Path,
        startup_timeout_s: float = 300,
        env: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
        cpu: bool | None = None,
        dtype: str = "bfloat16",
        served_model_name: str | None = None,
    ) -> None:
        if startup_timeout_s <= 0:
            raise ValueError(f"startup_timeout_s: must be > 0, got {startup_timeout_s}")
        self.model = model
        self.engine = engine if engine is not None else EngineSpec()
        self.host = host
        self.port = port if port is not None else free_port(host)
        self.log_path = Path(log_path)
        self.startup_timeout_s = startup_timeout_s
        self.cpu = (not cuda_available()) if cpu is None else cpu
        self.model_name = served_model_name if served_model_name is not None else model
        self.env = dict(os.environ if env is None else {**os.environ, **env})
        if self.cpu:
            self.env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(DEFAULT_CPU_KVCACHE_SPACE_GIB))
            if self.engine.tensor_parallel_size * self.engine.pipeline_parallel_size == 1:
                self.env.setdefault(CPU_MULTIPROCESSING_VAR, "0")
            if self.env.get(CPU_MULTIPROCESSING_VAR) == "0":
                # Without the worker process vLLM binds no compute threads: leave one core to
                # the API server and the client, as vLLM's own binding reserves one.
                self.env.setdefault("OMP_NUM_THREADS", str(cpu_compute_threads()))
        self.env["PYTHONUNBUFFERED"] = "1"  # so the log tail is current when startup fails
        self.command = [
            sys.executable,
            "-m",
            API_SERVER_MODULE,
            *vllm_serve_args(
                model,
                self.engine,
                dtype=dtype,
                served_model_name=served_model_name,
                enforce_eager=True if self.cpu else None,
                cpu=self.cpu,
                extra_args=extra_args,
            ),
            "--host",
            host,
            "--port",
            str(self.port),
        ]
        self.process: subprocess.Popen[bytes] | None = None
        self._log_offset = 0

    @property
    def url(self) -> str:
        """The server's base URL, ``http://host:port`` (the OpenAI API is under ``/v1``)."""
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """Process id of the API server, which is also its process group id; None before start."""
        return self.process.pid if self.process is not None else None

    def alive(self) -> bool:
        """Whether the API server process is running."""
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        """Launch the server and wait until ``GET /health`` answers 200.

        Raises :class:`ServerStartError` (after stopping whatever was started) if the port is
        taken, the process exits first, or ``startup_timeout_s`` passes.
        """
        import httpx

        if self.process is not None:
            raise RuntimeError(f"server on port {self.port} was already started")
        if port_in_use(self.host, self.port):
            raise ServerStartError(
                f"port {self.port} on {self.host} is already in use; pass another port "
                "(or port=None for a free one)",
                exit_code=None,
                log_path=None,
                log_tail="",
            )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self._log_offset = log.tell()
            log.write(f"=== servesim: {shlex.join(self.command)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,  # its own process group, so stop() reaches every child
            )
        atexit.register(self._stop_at_exit)
        self._install_sigterm()
        deadline = time.monotonic() + self.startup_timeout_s
        with httpx.Client(timeout=2.0) as client:
            while True:
                exit_code = self.process.poll()
                if exit_code is not None:
                    self._fail(f"vLLM server exited during startup (port {self.port})")
                try:
                    if client.get(f"{self.url}/health").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass  # not listening yet
                if time.monotonic() >= deadline:
                    self._fail(
                        f"vLLM server not healthy after {self.startup_timeout_s:g} s "
                        f"(port {self.port}); raise startup_timeout_s if it is just slow"
                    )
                time.sleep(0.5)

    def _fail(self, reason: str) -> None:
        exit_code = self.stop(grace_s=5)
        text = self._log_text()
        if any(marker in text.lower() for marker in _PORT_IN_USE_MARKERS):
            reason = f"port {self.port} on {self.host} is already in use; {reason}"
        raise ServerStartError(
            reason,
            exit_code=exit_code,
            log_path=self.log_path,
            log_tail=self.log_tail(),
            first_error=_first_error(text),
        )

    def _log_text(self) -> str:
        try:
            with self.log_path.open("rb") as log:
                log.seek(self._log_offset)
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def log_tail(self, num_lines: int = LOG_TAIL_LINES) -> str:
        """The last ``num_lines`` lines this server wrote to its log (since :meth:`start`)."""
        return "\n".join(self._log_text().splitlines()[-num_lines:])

    def stop(self, grace_s: float = 20) -> int | None:
        """Stop the server's whole process group; return the API server's exit code.

        SIGTERM to the group, up to ``grace_s`` for every member to exit, then SIGKILL to the
        group. Safe to call more than once, and before :meth:`start` (returns None).
        """
        if self.process is None:
            return None
        pgid = self.process.pid
        _signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _group_alive(pgid):
            _signal_group(pgid, signal.SIGKILL)
            kill_deadline = time.monotonic() + 10
            while _group_alive(pgid) and time.monotonic() < kill_deadline:
                time.sleep(0.05)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)
        # Orphaned children leave zombies until init reaps them (~2 s in some containers); wait a
        # little so that, on return, the group is usually gone altogether.
        reap_deadline = time.monotonic() + ZOMBIE_REAP_WAIT_S
        while _group_exists(pgid) and time.monotonic() < reap_deadline:
            time.sleep(0.05)
        # Only now: a second Ctrl-C during the shutdown must still find the exit hook.
        with contextlib.suppress(ValueError):
            atexit.unregister(self._stop_at_exit)
        self._restore_sigterm()
        return self.process.returncode

    def _stop_at_exit(self) -> None:
        self.stop(grace_s=5)

    def _install_sigterm(self) -> None:
        """Turn SIGTERM (a CI timeout, ``kill``) into SystemExit so ``finally`` stops the server.

        The server runs in its own session, so nothing else would stop it. Only from the main
        thread, and only where nobody installed a handler of their own.
        """
        self._previous_sigterm: Any = None
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return

        def exit_on_sigterm(signum: int, frame: object) -> None:
            raise SystemExit(128 + signum)

        self._previous_sigterm = signal.signal(signal.SIGTERM, exit_on_sigterm)

    def _restore_sigterm(self) -> None:
        previous = getattr(self, "_previous_sigterm", None)
        if previous is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous)
            self._previous_sigterm = None

    def __enter__(self) -> VLLMServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "alive" if self.alive() else "stopped"
        return f"VLLMServer({self.model_name!r}, url={self.url!r}, pid={self.pid}, {state})"


_ERROR_LINE = re.compile(r"(?:^|[\s\]])((?:[A-Za-z_][\w.]*)?(?:Error|Exception): .+)$")


def _first_error(log_text: str) -> str | None:
    """The first ``SomethingError: message`` in a log, skipping warnings that quote one."""
    for line in log_text.splitlines():
        match = _ERROR_LINE.search(line)
        if match and "WARNING" not in line:
            return match.group(1).strip()
    return None


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def group_members(pgid: int) -> list[int]:
    """Pids of the live (not zombie) processes in process group ``pgid``."""
    try:
        import psutil
    except ImportError:  # without psutil, any member (even a zombie) counts
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        return [pgid]
    members = []
    for proc in psutil.process_iter(["pid", "status"]):
        with contextlib.suppress(psutil.Error):
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) == pgid:
                members.append(proc.pid)
    return members


def _group_alive(pgid: int) -> bool:
    return bool(group_members(pgid))


def _group_exists(pgid: int) -> bool:
    """Whether any process, zombies included, is still in group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def attach(url: str, *, timeout_s: float = 10) -> str:
    """Check an existing OpenAI-compatible endpoint and return the name of the model it serves.

    ``GET /health`` must answer 200 (a server without that route may answer 404), and
    ``GET /v1/models`` must list a model. Raises :class:`EndpointError` saying what failed.
    """
    import httpx

    base = base_url(url)
    try:
        with httpx.Client(timeout=timeout_s) as client:
            health = client.get(f"{base}/health")
            if health.status_code not in (200, 404):
                raise EndpointError(f"{base}/health answered {health.status_code}: not healthy")
            models = client.get(f"{base}/v1/models")
    except httpx.HTTPError as error:
        raise EndpointError(f"cannot reach {base}: {error!r}; is the server running?") from error
    if models.status_code != 200:
        raise EndpointError(f"{base}/v1/models answered {models.status_code}")
    try:
        name = models.json()["data"][0]["id"]
    except (ValueError, KeyError, IndexError, TypeError) as error:
        raise EndpointError(f"{base}/v1/models lists no model: {models.text[:200]!r}") from error
    return str(name)
