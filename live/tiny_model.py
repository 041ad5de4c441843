"""A tiny Llama model with random weights and a small local tokenizer, for live runs on a laptop.

The live executor needs *a* real model behind a real vLLM server, not a good one: the server does
the same scheduling, paging and prefix caching whatever the weights say. This module writes a
~3M-parameter Llama-architecture checkpoint and a byte-level BPE tokenizer trained on a seeded
synthetic corpus, so the whole live loop runs offline on a CPU. Everything is deterministic in the
spec: the same :class:`TinyModelSpec` gives byte-identical config and tokenizer files and
identical weights.

torch, transformers and tokenizers are imported inside the functions that need them, so the
package imports without them.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import os
import random
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sim.files import DocumentError, read_document

#: Bump when the generator changes in a way that changes its output; it is part of the cache key.
FORMAT_VERSION = 1
#: The stamp written last into a finished model directory; its presence means "complete".
STAMP_NAME = "servesim_tiny_model.json"
#: Token ids of the two special tokens (the tokenizer trainer puts them first).
BOS_TOKEN_ID = 0
EOS_TOKEN_ID = 1
#: A minimal chat template so /v1/chat/completions works too.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
_NUM_BYTE_TOKENS = 256  # the byte-level alphabet every vocabulary starts with
_NUM_SPECIAL_TOKENS = 2


@dataclass(frozen=True)
class TinyModelSpec:
    """Architecture and seed of the tiny Llama model (hidden size, layers, heads, vocabulary)."""

    hidden_size: int = 256
    intermediate_size: int = 512
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    vocab_size: int = 1024
    max_position_embeddings: int = 4096
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("hidden_size", "intermediate_size", "num_layers", "num_heads"):
            if getattr(self, name) < 1:
                raise ValueError(f"TinyModelSpec.{name}: must be >= 1, got {getattr(self, name)}")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"TinyModelSpec.hidden_size ({self.hidden_size}) must be a multiple of "
                f"num_heads ({self.num_heads})"
            )
        if self.num_kv_heads < 1 or self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"TinyModelSpec.num_kv_heads ({self.num_kv_heads}) must divide "
                f"num_heads ({self.num_heads})"
            )
        min_vocab = _NUM_BYTE_TOKENS + _NUM_SPECIAL_TOKENS + 1
        if not min_vocab <= self.vocab_size <= 8192:
            raise ValueError(
                f"TinyModelSpec.vocab_size: must be in [{min_vocab}, 8192] (a byte-level "
                f"alphabet plus merges learnt from a small corpus), got {self.vocab_size}"
            )
        if self.max_position_embeddings < 16:
            raise ValueError(
                "TinyModelSpec.max_position_embeddings: must be >= 16, "
                f"got {self.max_position_embeddings}"
            )

    def stamp(self) -> dict[str, Any]:
        """What the stamp file holds: the spec and the generator's format version."""
        return {"format_version": FORMAT_VERSION, "spec": asdict(self)}

    def key(self) -> str:
        """A short hash of :meth:`stamp`, naming the cache directory of this spec."""
        text = json.dumps(self.stamp(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def default_tiny_model_dir(spec: TinyModelSpec = TinyModelSpec()) -> Path:
    """Where :func:`ensure_tiny_model` keeps the model of ``spec``: outside the repository.

    ``$SERVESIM_CACHE/tiny-llama-<key>`` if ``SERVESIM_CACHE`` is set, else under
    ``$XDG_CACHE_HOME/servesim`` (``~/.cache/servesim`` by default).
    """
    root = os.environ.get("SERVESIM_CACHE")
    if root:
        base = Path(root)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = (Path(xdg) if xdg else Path.home() / ".cache") / "servesim"
    return base / f"tiny-llama-{spec.key()}"


def ensure_tiny_model(spec: TinyModelSpec = TinyModelSpec()) -> Path:
    """The directory of the tiny model of ``spec`` in the default cache, written if missing."""
    return write_tiny_model(default_tiny_model_dir(spec), spec)


def write_tiny_model(
    directory: str | Path,
    spec: TinyModelSpec = TinyModelSpec(),
) -> Path:
    """Write the tiny model of ``spec`` into ``directory`` and return the directory.

    If ``directory`` already holds a model written from the same spec (its stamp file says so),
    nothing is written. Otherwise the model is built in a temporary sibling directory and renamed
    into place, so an interrupted write never looks complete. A directory holding a tiny model of
    another spec is replaced; any other non-empty directory is an error rather than overwritten.
    """
    directory = Path(directory).expanduser().resolve()
    if _has_stamp(directory, spec):
        return directory
    if directory.exists() and not _replaceable(directory):
        raise ValueError(
            f"{directory}: exists and is not a servesim tiny model; pass an empty or new directory"
        )
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.tmp-", dir=directory.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; a model directory is ordinary data
    try:
        _build(staging, spec)
        # The stamp goes in last: a directory with a stamp is a complete model.
        (staging / STAMP_NAME).write_text(json.dumps(spec.stamp(), indent=2, sort_keys=True))
        _move_into_place(staging, directory, spec)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return directory


def _has_stamp(directory: Path, spec: TinyModelSpec) -> bool:
    try:
        stamp = read_document(directory / STAMP_NAME, format="json")
    except DocumentError:
        return False
    return bool(stamp == spec.stamp())


def _replaceable(directory: Path) -> bool:
    """An empty directory, or one holding a tiny model of some spec (ours to replace)."""
    if not directory.is_dir():
        return False
    return not any(directory.iterdir()) or (directory / STAMP_NAME).is_file()


def _move_into_place(staging: Path, directory: Path, spec: TinyModelSpec) -> None:
    if directory.exists():
        # Move the old one aside first: rename cannot replace a non-empty directory.
        old = Path(tempfile.mkdtemp(prefix=f".{directory.name}.old-", dir=directory.parent))
        with contextlib.suppress(FileNotFoundError):
            directory.rename(old / "model")
        shutil.rmtree(old, ignore_errors=True)
    try:
        staging.rename(directory)
    except OSError:
        # Another process finished the same model first; theirs is as good as ours.
        if not _has_stamp(directory, spec):
            raise


def _corpus(spec: TinyModelSpec) -> list[str]:
    """Seeded synthetic text: random lowercase 'words' arranged in lines."""
    rng = random.Random(spec.seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(1, 8))) for _ in range(3000)]
    return [" ".join(rng.choice(words) for _ in range(50)) for _ in range(2000)]


def _build(directory: Path, spec: TinyModelSpec) -> None:
    """Train the tokenizer and save it with a randomly initialised model into ``directory``."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    # transformers' annotations are partial (untyped constructors); treat the module as Any.
    transformers: Any = importlib.import_module("transformers")

    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(spec), trainer)
    if tokenizer.get_vocab_size() != spec.vocab_size:
        raise ValueError(
            f"TinyModelSpec.vocab_size: the synthetic corpus yields only "
            f"{tokenizer.get_vocab_size()} tokens, asked for {spec.vocab_size}; ask for fewer"
        )
    assert tokenizer.token_to_id("<s>") == BOS_TOKEN_ID
    assert tokenizer.token_to_id("</s>") == EOS_TOKEN_ID
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        model_max_length=spec.max_position_embeddings,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(directory))

    config = transformers.LlamaConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=BOS_TOKEN_ID,
        eos_token_id=EOS_TOKEN_ID,
        tie_word_embeddings=False,
        dtype="bfloat16",
    )
    # Seed a forked RNG so the caller's global torch RNG state is left as it was.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(str(directory))
