"""The base of every scenario section: unknown keys are errors, values are immutable, and the
constrained number types the sections share."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from sim.workload.generate import MAX_TOKENS


class Spec(BaseModel):
    """Base for scenario sections: unknown keys are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


PositiveFloat = Annotated[float, Field(gt=0)]
PositiveInt = Annotated[int, Field(ge=1)]
#: A token count (a length, a prefix): positive and at most what a workload holds.
TokenCount = Annotated[int, Field(ge=1, le=MAX_TOKENS)]
NonNegativeInt = Annotated[int, Field(ge=0)]
Fraction = Annotated[float, Field(gt=0, le=1)]
