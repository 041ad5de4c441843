"""The base of every scenario section: unknown keys are errors, values are immutable, and the
constrained number types the sections share."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field


class Spec(BaseModel):
    """Base for scenario sections: unknown keys are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


PositiveFloat = Annotated[float, Field(gt=0)]
PositiveInt = Annotated[int, Field(ge=1)]
#: The most tokens a length may hold: workloads keep lengths as 32-bit integers (no model's
#: context comes near it).
MAX_TOKENS = 2**31 - 1
#: A token count (a length, a prefix): positive and at most MAX_TOKENS.
TokenCount = Annotated[int, Field(ge=1, le=MAX_TOKENS)]
NonNegativeInt = Annotated[int, Field(ge=0)]
Fraction = Annotated[float, Field(gt=0, le=1)]
