"""Writing calibration profiles: the profile of a fitted setup, stamped with when it was made.
The file format itself (:class:`~sim.engine.profile.Profile`, its reader and its check against a
scenario) lives in :mod:`sim.engine.profile`, beside the model that reads it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sim.engine.coefficients import CalibratedCoefficients
from sim.engine.profile import SCHEMA_VERSION, EngineInfo, FitReport, Profile
from sim.scenario import Scenario

__all__ = ["EngineInfo", "fitted_profile", "now_iso"]


def fitted_profile(
    scenario: Scenario,
    coefficients: CalibratedCoefficients,
    fit: FitReport,
    *,
    engine: EngineInfo | None = None,
    data_summary: dict[str, Any] | None = None,
) -> Profile:
    """A profile for the setup a scenario describes (model, hardware, TP, dtype, engine knobs)."""
    return Profile(
        schema_version=SCHEMA_VERSION,
        model=scenario.resolve_model().name,
        hardware=scenario.resolve_gpu().name,
        tensor_parallel_size=scenario.engine.tensor_parallel_size,
        dtype=scenario.dtype,
        engine=engine or EngineInfo(),
        engine_knobs=scenario.engine.model_dump(mode="json"),
        created=now_iso(),
        coefficients=coefficients,
        fit=fit,
        data_summary=data_summary or {},
    )


def now_iso() -> str:
    """The current UTC time, for ``Profile.created``."""
    return datetime.now(UTC).isoformat(timespec="seconds")
