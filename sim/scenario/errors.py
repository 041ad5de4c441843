"""Scenario problems as one line each: :class:`ScenarioError`, and :func:`format_errors`, which
turns pydantic's validation errors into ``dotted.path: what is wrong, got X`` lines (union-member
tags and wrong-member noise dropped, "did you mean" hints for unknown keys)."""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from sim.scenario.model import Scenario


class ScenarioError(ValueError):
    """Invalid scenario: ``problems`` holds one line per problem, each naming its field."""

    def __init__(self, problems: list[str], source: str = "scenario") -> None:
        self.problems = problems
        self.source = source
        super().__init__(f"{source}: " + "; ".join(problems))

    def __str__(self) -> str:
        header = f"invalid {self.source}:" if self.source else "invalid scenario:"
        return "\n".join([header, *(f"  {p}" for p in self.problems)])


def _number(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _describe(error: ErrorDetails) -> str:
    kind = error["type"]
    ctx = error.get("ctx", {})
    given = error.get("input")
    if kind == "greater_than":
        return f"must be > {_number(ctx['gt'])}, got {given!r}"
    if kind == "greater_than_equal":
        return f"must be >= {_number(ctx['ge'])}, got {given!r}"
    if kind == "less_than_equal":
        return f"must be <= {_number(ctx['le'])}, got {given!r}"
    if kind == "less_than":
        return f"must be < {_number(ctx['lt'])}, got {given!r}"
    if kind == "missing":
        return "required field is missing"
    if kind == "literal_error":
        return f"must be one of {ctx['expected']}, got {given!r}"
    if kind == "union_tag_invalid":
        return f"unknown type {ctx.get('tag')!r}; expected one of {ctx.get('expected_tags')}"
    if kind == "union_tag_not_found":
        return f"needs a 'type' key, one of the types of this section ({ctx.get('discriminator')})"
    if kind == "value_error":
        return str(ctx.get("error", error["msg"]))
    return f"{error['msg'][0].lower()}{error['msg'][1:]}, got {given!r}"


def _clean_location(loc: tuple[Any, ...], data: Any) -> tuple[list[str], Any]:
    """Drop pydantic's union-member tags from a location, following the input data."""
    parts: list[str] = []
    node = data
    for item in loc:
        tag = isinstance(node, dict) and isinstance(item, str) and item not in node
        if tag and _is_union_tag(str(item), node):
            continue
        parts.append(str(item))
        if isinstance(node, dict):
            node = node.get(item)
        elif isinstance(node, list) and isinstance(item, int) and item < len(node):
            node = node[item]
        else:
            node = None
    return parts, node


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "tuple"}


def _is_union_tag(item: str, node: dict[str, Any]) -> bool:
    """Pydantic names the union member it tried ("poisson", "str", "CustomGPUSpec", …)."""
    return (
        node.get("type") == item
        or item in _TYPE_TAGS
        or item[:1].isupper()
        or not item.isidentifier()
    )


def _all_member_fields(path: list[str], data: Any) -> list[str]:
    """Fields of the union member selected by the input's ``type`` (or of the plain model)."""
    model: Any = Scenario
    node = data
    for part in path:
        fields = getattr(model, "model_fields", None)
        if not fields or part not in fields:
            return []
        node = node.get(part) if isinstance(node, dict) else None
        model = _member_for(fields[part].annotation, node)
    return list(getattr(model, "model_fields", {}))


def _member_for(annotation: Any, node: Any) -> Any:
    members = _models_in(annotation)
    if isinstance(node, dict) and "type" in node:
        for member in members:
            type_field = member.model_fields.get("type")
            if type_field is not None and node["type"] in getattr(
                type_field.annotation, "__args__", ()
            ):
                return member
    if isinstance(node, dict):
        # Pick the member whose fields cover most of the given keys.
        return max(members, key=lambda m: len(set(node) & set(m.model_fields)), default=None)
    return members[0] if members else None


def _models_in(annotation: Any) -> list[Any]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[Any] = []
    for arg in getattr(annotation, "__args__", ()):
        found.extend(_models_in(arg))
    return found


def format_errors(exc: ValidationError, data: Any) -> list[str]:
    """One line per problem, ``dotted.path: what is wrong, got X``, without pydantic noise."""
    lines: list[str] = []
    seen: set[str] = set()
    errors = exc.errors()
    # A union like ``model: str | {...}`` fails once per member; report the useful member only.
    for error in errors:
        parts, _ = _clean_location(tuple(error["loc"]), data)
        if error["type"] == "extra_forbidden":
            key = parts[-1]
            valid = _all_member_fields(parts[:-1], data)
            hint = difflib.get_close_matches(key, valid, n=1)
            suggestion = f"; did you mean '{hint[0]}'?" if hint else ""
            choices = f" (valid keys: {', '.join(valid)})" if valid and not hint else ""
            line = f"{'.'.join(parts)}: unknown key{suggestion}{choices}"
        elif error["type"] in ("string_type", "model_type", "dict_type") and _is_union_noise(
            error, errors
        ):
            continue
        else:
            message = _describe(error)
            # Domain objects name their own field ("p90: ..."); fold it into the path.
            field, _, rest = message.partition(": ")
            if rest and field in _all_member_fields(parts, data):
                parts, message = [*parts, field], rest
            line = f"{'.'.join(parts) or '(top level)'}: {message}"
        if line not in seen:
            seen.add(line)
            lines.append(line)
    return lines


def _is_union_noise(error: ErrorDetails, errors: list[ErrorDetails]) -> bool:
    """A 'wrong type for one union member' error when other members report the real problem."""
    noise = ("string_type", "model_type", "dict_type")
    return len(errors) > 1 and any(e["type"] not in noise for e in errors)
