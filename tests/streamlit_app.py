"""Start the Streamlit app as users do (``streamlit run dashboards/app.py`` from the repository
root, so .streamlit/config.toml applies) and stop it afterwards."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).parents[1]
APP = ROOT / "dashboards" / "app.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running_app(log_dir: Path, *extra_args: str) -> Iterator[tuple[str, int]]:
    """``(url, port)`` of the app, healthy; ``extra_args`` go to ``streamlit run``."""
    port = free_port()
    log_path = log_dir / "streamlit.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", str(APP), "--server.port", str(port),
             *extra_args],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as response:
                        if response.status == 200:
                            break
                except OSError:
                    pass
                if process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"streamlit did not start: {log_path.read_text()}")
                time.sleep(0.5)
            yield url, port
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
