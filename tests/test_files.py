"""Reading JSON and YAML files: the data, or one line naming the path and what is wrong."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sim.files import DocumentError, read_document, read_text


def write(path: Path, content: str | bytes) -> Path:
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def refusal(path: Path, **kwargs: object) -> DocumentError:
    with pytest.raises(DocumentError) as caught:
        read_document(path, **kwargs)  # type: ignore[call-overload]
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{path}: ")
    assert isinstance(caught.value, ValueError)
    return caught.value


def test_json_and_yaml_are_parsed_by_name_or_as_asked(tmp_path: Path) -> None:
    assert read_document(write(tmp_path / "a.json", '{"x": [1, 2]}')) == {"x": [1, 2]}
    assert read_document(write(tmp_path / "a.yaml", "x: [1, 2]\n")) == {"x": [1, 2]}
    assert read_document(write(tmp_path / "a.txt", "x: 1"), format="yaml") == {"x": 1}
    assert read_document(write(tmp_path / "b.txt", "[1]"), format="json", expect=list) == [1]


def test_a_byte_order_mark_is_dropped(tmp_path: Path) -> None:
    path = write(tmp_path / "bom.json", b'\xef\xbb\xbf{"a": 1}')
    assert read_document(path) == {"a": 1}
    assert read_text(path) == '{"a": 1}'


def test_a_missing_file_says_so_and_is_marked_missing(tmp_path: Path) -> None:
    error = refusal(tmp_path / "nowhere.yaml")
    assert error.missing and error.problem == "file not found"
    assert error.path == tmp_path / "nowhere.yaml"


def test_a_directory_is_not_a_file(tmp_path: Path) -> None:
    error = refusal(tmp_path)
    assert not error.missing and "directory" in error.problem


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")
def test_a_named_pipe_is_not_read(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.json")
    assert "not a regular file" in refusal(tmp_path / "pipe.json").problem


def test_bytes_that_are_not_utf8_are_named_with_their_line(tmp_path: Path) -> None:
    error = refusal(write(tmp_path / "latin.yaml", b"a: 1\nb: caf\xe9\n"))
    assert "not UTF-8" in error.problem and "0xe9" in error.problem and "line 2" in error.problem


def test_bad_json_gives_the_parsers_line_and_column(tmp_path: Path) -> None:
    error = refusal(write(tmp_path / "cut.json", '{\n  "model": '))
    assert error.problem.startswith("not valid JSON at line 2, column 12 (")


def test_bad_yaml_gives_the_parsers_line_and_column(tmp_path: Path) -> None:
    error = refusal(write(tmp_path / "bad.yaml", "a: 1\nb: [1, 2\nc: 3\n"))
    assert error.problem.startswith("not valid YAML at line 3, column 2 (")


def test_yaml_is_read_safely(tmp_path: Path) -> None:
    path = write(tmp_path / "unsafe.yaml", "!!python/object/apply:os.system ['true']\n")
    assert "not valid YAML" in refusal(path).problem


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("list.json", "[1, 2]", "expected a JSON object at the top level, got a JSON array"),
        ("list.yaml", "- 1\n- 2\n", "expected a mapping at the top level, got a list"),
        ("empty.yaml", "", "expected a mapping at the top level, got nothing"),
        ("number.json", "3", "expected a JSON object at the top level, got a JSON number"),
    ],
)
def test_the_top_level_type_is_checked_when_asked(
    tmp_path: Path, name: str, content: str, expected: str
) -> None:
    assert refusal(write(tmp_path / name, content), expect=dict).problem == expected


# -- limits: no input ends in a RecursionError or a billion-node expansion ---------------------


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_deeply_nested_documents_are_refused_with_a_message(tmp_path: Path) -> None:
    from sim.files import MAX_YAML_DEPTH

    deep_yaml = _write(tmp_path, "deep.yaml", "[" * 100_000)
    with pytest.raises(DocumentError, match=f"nested more than {MAX_YAML_DEPTH} levels"):
        read_document(deep_yaml)
    deep_json = _write(tmp_path, "deep.json", "[" * 100_000 + "]" * 100_000)
    with pytest.raises(DocumentError, match="nested too deeply"):
        read_document(deep_json)
    # Right at the limit still reads.
    ok = "[" * MAX_YAML_DEPTH + "]" * MAX_YAML_DEPTH
    assert read_document(_write(tmp_path, "ok.yaml", ok)) is not None


def test_alias_bombs_are_refused_and_ordinary_aliases_read(tmp_path: Path) -> None:
    from sim.files import MAX_YAML_ALIASES

    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}]" for i in range(1, MAX_YAML_ALIASES)]
    bomb = _write(tmp_path, "bomb.yaml", "\n".join(lines) + "\n")
    with pytest.raises(DocumentError, match=f"more than {MAX_YAML_ALIASES} aliases"):
        read_document(bomb)
    shared = _write(tmp_path, "shared.yaml", "base: &b {rate: 4}\nother: *b\n")
    assert read_document(shared) == {"base": {"rate": 4}, "other": {"rate": 4}}


def test_an_oversized_yaml_document_is_refused_before_parsing() -> None:
    from sim.files import MAX_YAML_BYTES, yaml_limit_problem

    problem = yaml_limit_problem("x" * (MAX_YAML_BYTES + 1))
    assert problem is not None and "bytes is more than" in problem


def test_a_deep_scenario_exits_2_with_one_line_and_no_traceback(tmp_path: Path) -> None:
    from tests.test_cli import servesim

    path = _write(tmp_path, "deep.yaml", "{a: " * 50_000)
    result = servesim("check", str(path))
    assert result.returncode == 2
    assert "nested more than" in result.stderr and "Traceback" not in result.stderr
    pytest.importorskip("streamlit")
    from dashboards.core import parse_yaml_text

    parsed = parse_yaml_text("[" * 10_000, "pasted YAML")
    assert parsed.scenario is None and "nested more than" in parsed.errors[0]
