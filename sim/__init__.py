"""servesim simulator: a SimPy discrete-event model of vLLM-like serving.

The engine's hot path may be compiled in place by mypyc (tools/build_native.py, ``make
native``); Python then imports the extension beside each source. An extension older than its
source runs the old code, so importing ``sim`` warns about it.
"""

import warnings
from pathlib import Path


def _stale_extensions() -> list[str]:
    """Sources edited after they were compiled (their extension runs the old code)."""
    root = Path(__file__).parent
    stale = []
    for extension in root.glob("*/*.cpython-*.so"):
        source = extension.with_name(extension.name.split(".", 1)[0] + ".py")
        if source.exists() and source.stat().st_mtime > extension.stat().st_mtime:
            stale.append(str(source.relative_to(root.parent)))
    return stale


if _stale := _stale_extensions():
    warnings.warn(
        f"compiled modules older than their source run the old code ({', '.join(_stale)}): "
        "run `make native` to recompile them, or `make native-clean` for pure Python",
        stacklevel=2,
    )
