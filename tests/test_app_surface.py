"""The app as an attack surface: it listens on this machine only unless told otherwise, and
it parses what users give it with safe loaders only. (Upload size caps, content-hash storage
of uploaded traces and inline errors for bad YAML: tests/test_dashboard.py.)"""

from __future__ import annotations

import ast
import socket
from pathlib import Path

import pytest

pytest.importorskip("streamlit")

from tests.streamlit_app import ROOT, running_app


def _listeners(port: int) -> set[str]:
    """Local addresses with a socket listening on ``port`` (IPv4 and IPv6), from /proc."""
    addresses = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        path = Path(table)
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            local, state = fields[1], fields[3]
            address, port_hex = local.rsplit(":", 1)
            if state == "0A" and int(port_hex, 16) == port:  # 0A: LISTEN
                addresses.add(address)
    return addresses


def test_the_app_listens_on_localhost_only_by_default(tmp_path: Path) -> None:
    # Started like a user would, with no --server.address: .streamlit/config.toml applies.
    with running_app(tmp_path) as (_, port):
        listeners = _listeners(port)
        assert listeners == {"0100007F"}, listeners  # 127.0.0.1, and nothing on 0.0.0.0 or ::
        outside = socket.gethostbyname(socket.gethostname())
        if not outside.startswith("127."):
            with socket.socket() as s, pytest.raises(OSError):
                s.settimeout(2)
                s.connect((outside, port))


def test_no_unsafe_loader_anywhere_in_the_app_or_the_simulator() -> None:
    """No pickle, eval/exec, yaml.load/unsafe_load or pandas.read_pickle on anything a user
    gives: scenarios go through yaml.safe_load and pydantic, traces through sim.workload.traces."""
    unsafe = {"eval", "exec", "load", "unsafe_load", "full_load", "read_pickle", "loads"}
    offenders = []
    for package in ("dashboards", "sim", "live", "calibration"):
        for path in (ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Import | ast.ImportFrom):
                    names = [alias.name for alias in node.names]
                    module = getattr(node, "module", None) or ""
                    if "pickle" in names or module == "pickle" or "marshal" in names:
                        offenders.append(f"{path}:{node.lineno} imports pickle/marshal")
                if isinstance(node, ast.Call):
                    function = node.func
                    name = (
                        function.attr
                        if isinstance(function, ast.Attribute)
                        else (function.id if isinstance(function, ast.Name) else "")
                    )
                    owner = (
                        function.value.id
                        if isinstance(function, ast.Attribute)
                        and isinstance(function.value, ast.Name)
                        else ""
                    )
                    if name in ("eval", "exec") and not owner:
                        offenders.append(f"{path}:{node.lineno} calls {name}")
                    if owner == "yaml" and name in unsafe:
                        offenders.append(f"{path}:{node.lineno} calls yaml.{name}")
                    if name == "read_pickle":
                        offenders.append(f"{path}:{node.lineno} calls read_pickle")
    assert not offenders, offenders
