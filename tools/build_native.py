"""Compile the simulator's hot path with mypyc, in place, beside the Python sources.

The engine modules below already pass ``mypy --strict``; mypyc turns them into C extensions
that Python imports instead of the ``.py`` files (an extension module wins over a source file in
the same folder). The records stay bit-identical (tests/test_native.py checks it) and the
pure-Python path stays: ``--clean`` removes the extensions, and nothing else changes.

Run: ``.venv/bin/python tools/build_native.py [--clean]`` (``make native``; ``make`` runs it
at install when a C compiler is present). Needs a C compiler and the Python headers.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: The modules a simulation step runs through (profile: benchmarks/speed.py --profile).
MODULES = (
    "sim/engine/collectives.py",
    "sim/engine/kv_cache.py",
    "sim/engine/latency.py",
    "sim/engine/replica.py",
    "sim/engine/request.py",
    "sim/engine/scheduler.py",
    "sim/engine/sequence.py",
    "sim/engine/static_batch.py",
    "sim/fleet/pool.py",
    "sim/fleet/router.py",
)
#: The shared library holding the compiled modules' common code: inside ``sim`` so that the
#: editable install's finder (which maps only the project's packages) imports it.
GROUP = "sim.native"
BUILD_DIR = ROOT / "build" / "native"


def extensions() -> list[Path]:
    """The compiled files in the source tree (modules and the shared library)."""
    found = [
        p for module in MODULES for p in (ROOT / module).parent.glob(Path(module).stem + ".*.so")
    ]
    return found + sorted((ROOT / "sim").glob("native__mypyc.*.so"))


def clean() -> None:
    """Remove every compiled module: the pure-Python sources are imported again."""
    for path in extensions():
        path.unlink()
    shutil.rmtree(BUILD_DIR, ignore_errors=True)


def build(quiet: bool = False) -> None:
    """Compile :data:`MODULES` in place (under a minute on two cores)."""
    from mypyc.build import mypycify
    from setuptools import setup

    os.chdir(ROOT)
    clean()
    options = ["--quiet"] if quiet else []
    modules = mypycify(list(MODULES), group_name=GROUP, opt_level="3", verbose=not quiet)
    with contextlib.redirect_stdout(io.StringIO()) if quiet else contextlib.nullcontext():
        setup(
            name="servesim-native",
            ext_modules=modules,
            script_args=[*options, "build_ext", "--inplace", "--build-temp", str(BUILD_DIR)],
        )
    for path in extensions():
        # build_ext copies a library it found up to date with its old time; the time is what
        # sim/__init__.py compares with the sources to tell a stale extension.
        path.touch()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clean", action="store_true", help="remove the compiled modules")
    parser.add_argument("--list", action="store_true", help="print the compiled modules' sources")
    parser.add_argument("--quiet", action="store_true", help="print only the outcome")
    args = parser.parse_args()
    if args.list:
        print(" ".join(MODULES))
        return
    if args.clean:
        clean()
        print(f"removed the compiled modules; {len(MODULES)} modules run as Python")
        return
    build(args.quiet)
    print(f"compiled with mypyc: {', '.join(MODULES)}")


if __name__ == "__main__":
    main()
