"""Scenario problems as one line each: :class:`ScenarioError`, and :func:`format_errors`, which
turns pydantic's validation errors into ``dotted.path: what is wrong, got X`` lines (union-member
tags and wrong-member noise dropped, "did you mean" hints for unknown keys)."""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from sim.scenario.model import Scenario

#: The longest problem line kept whole. A lower layer that repeats a huge value (an unknown
#: GPU name of 20,000 characters) is cut in the middle, so its field and its fix stay visible.
MAX_LINE_CHARS = 1000


def clipped(line: str) -> str:
    """``line``, or its start and end around how many characters were cut if it is longer than
    :data:`MAX_LINE_CHARS`."""
    if len(line) <= MAX_LINE_CHARS:
        return line
    head, tail = MAX_LINE_CHARS * 2 // 3, MAX_LINE_CHARS // 4
    return f"{line[:head]} ... ({len(line) - head - tail:,} characters cut) ... {line[-tail:]}"


class ScenarioError(ValueError):
    """Invalid scenario: ``problems`` holds one line per problem, each naming its field."""

    def __init__(self, problems: list[str], source: str = "scenario") -> None:
        problems = [clipped(problem) for problem in problems]
        self.problems = problems
        self.source = source
        super().__init__(f"{source}: " + "; ".join(problems))

    def __str__(self) -> str:
        header = f"invalid {self.source}:" if self.source else "invalid scenario:"
        return "\n".join([header, *(f"  {p}" for p in self.problems)])


def _number(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


#: The most characters of a given value an error line repeats: a 20,000-character string
#: in a number's place is named by its start and its length, so the line stays readable.
MAX_SHOWN_CHARS = 60


def _shown(value: Any) -> str:
    """``repr(value)``, cut to its first :data:`MAX_SHOWN_CHARS` characters if longer."""
    text = repr(value)
    if len(text) <= MAX_SHOWN_CHARS:
        return text
    return f"{text[:MAX_SHOWN_CHARS]}... ({len(text):,} characters)"


def _describe(error: ErrorDetails) -> str:
    kind = error["type"]
    ctx = error.get("ctx", {})
    given = error.get("input")
    if kind == "greater_than":
        return f"must be > {_number(ctx['gt'])}, got {_shown(given)}"
    if kind == "greater_than_equal":
        return f"must be >= {_number(ctx['ge'])}, got {_shown(given)}"
    if kind == "less_than_equal":
        return f"must be <= {_number(ctx['le'])}, got {_shown(given)}"
    if kind == "less_than":
        return f"must be < {_number(ctx['lt'])}, got {_shown(given)}"
    if kind == "missing":
        return "required field is missing"
    if kind == "literal_error":
        return f"must be one of {ctx['expected']}, got {_shown(given)}"
    if kind == "union_tag_invalid":
        return f"unknown type {_shown(ctx.get('tag'))}; expected one of {ctx.get('expected_tags')}"
    if kind == "union_tag_not_found":
        return f"needs a 'type' key, one of the types of this section ({ctx.get('discriminator')})"
    if kind == "value_error":
        return str(ctx.get("error", error["msg"]))
    return f"{error['msg'][0].lower()}{error['msg'][1:]}, got {_shown(given)}"


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
            line = f"{_dotted(parts)}: unknown key{suggestion}{choices}"
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
            line = f"{_dotted(parts) or '(top level)'}: {message}"
        if line not in seen:
            seen.add(line)
            lines.append(line)
    return lines


def _dotted(parts: list[str]) -> str:
    """The location as ``a.b.c``; a key with characters a terminal does not show as themselves
    (a right-to-left override, a zero-width space, a tab) is shown escaped."""
    return ".".join(
        part if part.isprintable() else part.encode("unicode_escape").decode("ascii")
        for part in parts
    )


def _is_union_noise(error: ErrorDetails, errors: list[ErrorDetails]) -> bool:
    """A 'wrong type for one union member' error when other members report the real problem."""
    noise = ("string_type", "model_type", "dict_type")
    return len(errors) > 1 and any(e["type"] not in noise for e in errors)
