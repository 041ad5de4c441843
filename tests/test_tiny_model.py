"""The tiny local model: shape from the spec, deterministic, cached, written atomically."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest

from live import tiny_model
from live.tiny_model import (
    STAMP_NAME,
    TinyModelSpec,
    default_tiny_model_dir,
    write_tiny_model,
)

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

#: Smaller than the default so the extra writes below stay quick.
SMALL = TinyModelSpec(hidden_size=64, intermediate_size=128, num_layers=1, vocab_size=300)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def default_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def test_config_and_tokenizer_follow_the_spec(default_model: Path) -> None:
    spec = TinyModelSpec()
    config = transformers.AutoConfig.from_pretrained(default_model)
    assert config.model_type == "llama"
    assert config.hidden_size == spec.hidden_size
    assert config.intermediate_size == spec.intermediate_size
    assert config.num_hidden_layers == spec.num_layers
    assert config.num_attention_heads == spec.num_heads
    assert config.num_key_value_heads == spec.num_kv_heads
    assert config.max_position_embeddings == spec.max_position_embeddings
    assert config.vocab_size == spec.vocab_size
    assert (config.bos_token_id, config.eos_token_id) == (0, 1)
    tokenizer = transformers.AutoTokenizer.from_pretrained(default_model)
    assert len(tokenizer) == spec.vocab_size
    assert tokenizer.convert_tokens_to_ids(["<s>", "</s>"]) == [0, 1]
    stamp = json.loads((default_model / STAMP_NAME).read_text())
    assert stamp == spec.stamp()


def test_tokenizer_decodes_every_id(default_model: Path) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(default_model)
    for token_id in range(TinyModelSpec().vocab_size):
        assert isinstance(tokenizer.decode([token_id]), str)
    text = "hello tiny world"
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_same_spec_writes_identical_files(default_model: Path, tmp_path: Path) -> None:
    again = write_tiny_model(tmp_path / "again")
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors"):
        assert sha256(again / name) == sha256(default_model / name), name


def test_seed_changes_weights_only(tmp_path: Path) -> None:
    first = write_tiny_model(tmp_path / "seed0", SMALL)
    other = write_tiny_model(tmp_path / "seed1", TinyModelSpec(**{**vars(SMALL), "seed": 1}))
    assert sha256(first / "model.safetensors") != sha256(other / "model.safetensors")
    assert sha256(first / "config.json") == sha256(other / "config.json")


def test_cache_hit_returns_without_rewriting(default_model: Path) -> None:
    mtimes = {path.name: path.stat().st_mtime_ns for path in default_model.iterdir()}
    assert write_tiny_model(default_model) == default_model
    assert {path.name: path.stat().st_mtime_ns for path in default_model.iterdir()} == mtimes


def test_other_spec_replaces_a_tiny_model(tmp_path: Path) -> None:
    directory = write_tiny_model(tmp_path / "model", SMALL)
    bigger = TinyModelSpec(**{**vars(SMALL), "vocab_size": 320})
    write_tiny_model(directory, bigger)
    assert json.loads((directory / STAMP_NAME).read_text()) == bigger.stamp()
    assert json.loads((directory / "config.json").read_text())["vocab_size"] == 320
    assert [path.name for path in tmp_path.iterdir()] == ["model"]  # no leftovers


def test_refuses_to_overwrite_a_foreign_directory(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not a servesim tiny model"):
        write_tiny_model(tmp_path, SMALL)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_interrupted_write_leaves_nothing_that_looks_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def crash(directory: Path, spec: TinyModelSpec) -> None:
        (directory / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(tiny_model, "_build", crash)
    with pytest.raises(KeyboardInterrupt):
        write_tiny_model(tmp_path / "model", SMALL)
    assert list(tmp_path.iterdir()) == []


def test_default_dir_is_keyed_by_spec(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SERVESIM_CACHE", str(tmp_path))
    first = default_tiny_model_dir(TinyModelSpec())
    assert first.parent == tmp_path
    assert first.name.startswith("tiny-llama-")
    assert default_tiny_model_dir(TinyModelSpec()) == first
    assert default_tiny_model_dir(TinyModelSpec(seed=1)) != first


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"hidden_size": 250}, "hidden_size"),
        ({"num_kv_heads": 3}, "num_kv_heads"),
        ({"vocab_size": 100}, "vocab_size"),
    ],
)
def test_spec_rejects_impossible_shapes(changes: dict[str, int], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        TinyModelSpec(**changes)


def test_the_default_tiny_model_is_the_catalogue_entry(tmp_path: Path) -> None:
    from sim.catalog.hf_config import load_hf_config
    from sim.catalog.models import get_model

    directory = write_tiny_model(tmp_path / "m")
    written = load_hf_config(directory / "config.json")
    catalogue = get_model("servesim-tiny-llama")
    assert dataclasses.replace(written, name=catalogue.name) == catalogue
