"""A catalogue of bad calibration profiles, each run through the CLI as a user would meet it.

Every case ends with exit code 2 and one line that names the profile and says what to do; none
shows a traceback. Cases run in-process (CliRunner), where an uncaught exception would surface as
exit code 1 with ``result.exception`` set, so exit code 2 alone proves the error was handled.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from servesim.cli import app
from sim.engine.profile import ProfileError, load_profile
from tests.factories import scenario_dict
from tests.test_profile import make_profile

runner = CliRunner()


def good_profile_json() -> dict[str, object]:
    """A valid profile for the factory scenario (Llama-3.1-8B on one H100 SXM), as JSON data."""
    loaded: dict[str, object] = json.loads(make_profile().model_dump_json())
    return loaded


def without(key: str) -> dict[str, object]:
    data = good_profile_json()
    del data[key]
    return data


def with_fields(**fields: object) -> dict[str, object]:
    data = good_profile_json()
    data.update(fields)
    return data


def with_coefficient(**coefficients: object) -> dict[str, object]:
    data = good_profile_json()
    assert isinstance(data["coefficients"], dict)
    data["coefficients"] = {**data["coefficients"], **coefficients}
    return data


def write_json(data: object) -> Callable[[Path], None]:
    return lambda path: path.write_text(json.dumps(data))


def write_bytes(make: Callable[[], bytes]) -> Callable[[Path], None]:
    return lambda path: path.write_bytes(make())


def good_text() -> str:
    return make_profile().model_dump_json(indent=2)


#: (case id, how to write the profile file, what the one error line must contain).
BAD_PROFILES: list[tuple[str, Callable[[Path], None], tuple[str, ...]]] = [
    (
        "older_schema_version",
        write_json(with_fields(schema_version=0)),
        ("schema_version 0 is not supported", "re-run `servesim calibrate`"),
    ),
    (
        "newer_schema_version",
        write_json(with_fields(schema_version=2)),
        ("schema_version 2 is not supported", "upgrade servesim"),
    ),
    (
        "schema_version_missing",
        write_json(without("schema_version")),
        ("schema_version: missing", "servesim calibrate"),
    ),
    (
        "schema_version_not_a_number",
        write_json(with_fields(schema_version="1")),
        ("schema_version '1' is not supported", "re-run `servesim calibrate`"),
    ),
    (
        "another_model",
        write_json(with_fields(model="llama-3.1-70b")),
        ("model='llama-3.1-70b'", "model='llama-3.1-8b'", "calibrate for this setup"),
    ),
    (
        "another_gpu",
        write_json(with_fields(hardware="A100 80GB SXM")),
        ("hardware='A100 80GB SXM'", "hardware='H100 SXM'", "calibrate for this setup"),
    ),
    (
        "another_tensor_parallel_size",
        write_json(with_fields(tensor_parallel_size=2)),
        ("tensor_parallel_size=2", "tensor_parallel_size=1", "calibrate for this setup"),
    ),
    (
        "another_dtype",
        write_json(with_fields(dtype="fp8")),
        ("dtype='fp8'", "dtype='bf16'", "calibrate for this setup"),
    ),
    (
        "truncated_json",
        lambda path: path.write_text(good_text()[:150]),
        ("not valid JSON at line", "truncated", "servesim calibrate"),
    ),
    ("empty_file", lambda path: path.write_text(""), ("the profile is empty", "calibrate")),
    (
        "json_array",
        write_json([good_profile_json()]),
        ("expected a JSON object", "got a JSON array"),
    ),
    ("json_string", write_json("profile"), ("expected a JSON object", "got a JSON string")),
    (
        "missing_coefficients",
        write_json(without("coefficients")),
        ("coefficients: Field required", "fix that field"),
    ),
    (
        "missing_model",
        write_json(without("model")),
        ("model: Field required", "fix that field"),
    ),
    (
        "coefficient_not_a_number",
        write_json(with_coefficient(step_overhead_s="x")),
        ("coefficients.step_overhead_s", "valid number", "fix that field"),
    ),
    (
        "negative_coefficient",
        write_json(with_coefficient(per_decode_seq_s=-1)),
        ("per_decode_seq_s: must be a finite number >= 0", "fix that field"),
    ),
    (
        "unknown_field",
        write_json(with_fields(coefficient={})),
        ("coefficient: Extra inputs are not permitted", "fix that field"),
    ),
    (
        "latin1_bytes",
        write_bytes(
            lambda: good_text().replace('"created": ""', '"created": "café"').encode("latin-1")
        ),
        ("not a UTF-8 text file", "byte 0xe9", "re-encode it as UTF-8"),
    ),
    (
        "utf16_file",
        write_bytes(lambda: good_text().encode("utf-16")),
        ("not a UTF-8 text file", "byte 0xff at byte offset 0"),
    ),
    (
        "gzip_file",
        write_bytes(lambda: gzip.compress(good_text().encode())),
        ("not a UTF-8 text file", "line 1"),
    ),
]


def scenario_with_profile(tmp_path: Path, profile_path: Path) -> Path:
    """The factory scenario (5 requests) with ``latency: {profile: profile_path}``."""
    data = scenario_dict(latency={"profile": str(profile_path)})
    data["workload"]["num_requests"] = 5
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def assert_one_line_error(output: str, exit_code: int, *expected: str) -> None:
    assert exit_code == 2, output
    assert "Traceback" not in output
    lines = output.strip().splitlines()
    assert len(lines) == 1, output
    for text in expected:
        assert text in lines[0], (text, output)


def test_the_good_profile_runs(tmp_path: Path) -> None:
    profile = tmp_path / "profile.json"
    write_json(good_profile_json())(profile)
    result = runner.invoke(app, ["run", str(scenario_with_profile(tmp_path, profile)), "--json"])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("command", ["run", "check"])
@pytest.mark.parametrize(
    ("write", "expected"),
    [pytest.param(write, expected, id=name) for name, write, expected in BAD_PROFILES],
)
def test_bad_profile_is_one_line_naming_the_file_and_the_fix(
    tmp_path: Path, command: str, write: Callable[[Path], None], expected: tuple[str, ...]
) -> None:
    profile = tmp_path / "profile.json"
    write(profile)
    result = runner.invoke(app, [command, str(scenario_with_profile(tmp_path, profile))])
    assert_one_line_error(result.output, result.exit_code, str(profile), *expected)


@pytest.mark.parametrize("command", ["run", "check"])
def test_missing_profile_path_is_a_scenario_error(tmp_path: Path, command: str) -> None:
    profile = tmp_path / "nope.json"
    result = runner.invoke(app, [command, str(scenario_with_profile(tmp_path, profile))])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert f"latency.path: profile not found: {profile}" in result.output


@pytest.mark.parametrize("command", ["run", "check"])
def test_a_directory_given_as_the_profile_is_refused(tmp_path: Path, command: str) -> None:
    # The scenario check reports it as not found (it tests is_file); sim/scenario/ could say
    # "is a directory" instead, as load_profile does when called directly.
    result = runner.invoke(app, [command, str(scenario_with_profile(tmp_path, tmp_path))])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert f"latency.path: {tmp_path} is a directory" in result.output


def test_a_profile_path_too_long_to_read_is_a_clear_error() -> None:
    # Found by benchmarks/fuzz.py: the error path asked whether the path was a directory, and
    # that raised a second OSError (file name too long) as a traceback.
    with pytest.raises(ProfileError, match="cannot read the profile"):
        load_profile("p" * 5000 + ".json")
