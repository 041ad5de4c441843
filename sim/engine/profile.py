"""The calibration-profile file format: fitted iteration-time coefficients for one model ×
hardware × TP × dtype, read here where the simulator uses them (``calibration/`` writes them).

A profile is a versioned JSON file (validated with pydantic) that says what it was measured on
(model, hardware, tensor parallelism, dtype, engine name and version, the engine knobs in force),
when, the coefficients of :class:`sim.engine.latency.CalibratedModel`, how well they fit, and a
summary of the data they were fitted on. The simulator uses one with ``latency: {profile: PATH}``.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sim.engine.coefficients import CalibratedCoefficients

SCHEMA_VERSION = 1


class ProfileError(ValueError):
    """A profile that cannot be used: unreadable, another schema, or another setup."""


class ProfileMismatchWarning(UserWarning):
    """The profile was measured on an older engine version than the scenario names."""


class EngineInfo(BaseModel):
    """The serving engine a profile was measured on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "vllm"
    version: str = ""


class FitReport(BaseModel):
    """How well the coefficients reproduce the data they were fitted on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    method: str
    num_points: int
    relative_error_mean: float
    relative_error_p90: float
    relative_error_max: float
    points: list[dict[str, float]] = Field(default_factory=list)  # measured vs predicted, per point
    notes: list[str] = Field(default_factory=list)  # e.g. terms the data could not identify
    # Leave-one-workload-out (a fit to several record sets): per workload left out, its mean
    # relative TTFT and E2E errors under coefficients fitted on the others.
    held_out: list[dict[str, float | str]] = Field(default_factory=list)


class Profile(BaseModel):
    """A calibration profile (see module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: int
    model: str
    hardware: str
    tensor_parallel_size: int = 1
    dtype: str = "bf16"
    engine: EngineInfo = EngineInfo()
    engine_knobs: dict[str, Any] = Field(default_factory=dict)
    created: str = ""
    coefficients: CalibratedCoefficients
    fit: FitReport
    data_summary: dict[str, Any] = Field(default_factory=dict)

    def save(self, path: str | Path) -> Path:
        """Write the profile as indented JSON."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.model_dump_json(indent=2) + "\n", encoding="utf-8")
        return path


def load_profile(path: str | Path) -> Profile:
    """Read and validate a profile; ProfileError is one line naming the file, what is wrong and
    what to do (the field for a bad value; re-calibrating for another schema or a broken file).
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        # IsADirectoryError, not path.is_dir(): that raises again for a name too long to stat.
        directory = isinstance(exc, IsADirectoryError)
        what = "it is a directory, give the profile's .json file" if directory else exc.strerror
        raise ProfileError(f"{path}: cannot read the profile: {what}") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ProfileError(
            f"{path}: not a UTF-8 text file (byte 0x{raw[exc.start]:02x} at byte offset "
            f"{exc.start}, line {line}); a profile is the JSON file `servesim calibrate` writes: "
            "re-encode it as UTF-8 or re-run `servesim calibrate`"
        ) from None
    if not text.strip():
        raise ProfileError(f"{path}: the profile is empty; re-run `servesim calibrate`")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(
            f"{path}: not valid JSON at line {exc.lineno}, column {exc.colno} ({exc.msg}); "
            "is the file truncated? re-run `servesim calibrate` to write it again"
        ) from None
    if not isinstance(data, dict):
        raise ProfileError(
            f"{path}: expected a JSON object (the file `servesim calibrate` writes), got a JSON "
            f"{_json_type(data)}"
        )
    if "schema_version" not in data:
        raise ProfileError(
            f"{path}: schema_version: missing; this is not a servesim profile (write one with "
            "`servesim calibrate`)"
        )
    version = data["schema_version"]
    if version != SCHEMA_VERSION:
        newer = type(version) is int and version > SCHEMA_VERSION
        remedy = (
            "upgrade servesim, or re-run `servesim calibrate` with this one"
            if newer
            else "re-run `servesim calibrate` to produce a current profile"
        )
        raise ProfileError(
            f"{path}: schema_version {version!r} is not supported (this servesim reads "
            f"{SCHEMA_VERSION}); {remedy}"
        )
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "profile"
        more = len(exc.errors()) - 1
        also = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
        raise ProfileError(
            f"{path}: {where}: {first['msg']}{also}; fix that field or re-run `servesim calibrate`"
        ) from None


def _json_type(value: object) -> str:
    match value:
        case list():
            return "array"
        case str():
            return "string"
        case bool():
            return "boolean"
        case int() | float():
            return "number"
        case None:
            return "null"
    return type(value).__name__


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def check_profile(
    profile: Profile,
    *,
    model: str,
    hardware: str,
    tensor_parallel_size: int,
    dtype: str,
    engine_version: str | None = None,
    source: str = "profile",
) -> None:
    """Refuse a profile measured on another setup; warn when its engine version is older."""
    expected = {
        "model": model,
        "hardware": hardware,
        "tensor_parallel_size": tensor_parallel_size,
        "dtype": dtype,
    }
    for field, value in expected.items():
        measured = getattr(profile, field)
        if str(measured).lower() != str(value).lower():
            raise ProfileError(
                f"latency.profile: {source} was measured with {field}={measured!r} but the "
                f"scenario has {field}={value!r}; calibrate for this setup or change the scenario"
            )
    measured_version = profile.engine.version
    if (
        engine_version
        and measured_version
        and _version_tuple(measured_version) < _version_tuple(engine_version)
    ):
        warnings.warn(
            f"{source} was measured on {profile.engine.name} {profile.engine.version}, older "
            f"than the scenario's {engine_version}; its step times may be out of date",
            ProfileMismatchWarning,
            stacklevel=2,
        )


def calibrated_envelope(profile: Profile) -> dict[str, float]:
    """The largest step the profile's measurements saw: decode sequences, context tokens
    attended and prefill tokens in one step (from the fit report's points; empty when the
    report has none, as in a records fit)."""
    points = [p for p in profile.fit.points if "num_decode_seqs" in p]
    if not points:
        return {}
    return {
        name: max(float(p.get(name, 0.0)) for p in points)
        for name in ("num_decode_seqs", "context_tokens", "num_prefill_tokens")
    }
