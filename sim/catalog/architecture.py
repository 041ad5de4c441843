"""Model architectures: parameter counts, weight bytes and KV-cache bytes per token.

Decoder-only transformers of the Llama family (RMSNorm, grouped-query attention, gated SiLU
MLP, no MLP biases); Mistral, Qwen2/2.5, Qwen3 and Phi-3/Phi-4 share that shape, Qwen2 adding
biases to the q, k and v projections and Qwen3 an RMSNorm over each head's q and k (Phi-3 fuses q,
k and v into one projection and gate and up into another: the same weights, counted alike).
Mixtures of experts (Mixtral, Qwen3-MoE, DeepSeek-MoE) and DeepSeek's latent attention are
described by optional fields. That is all a serving simulator needs: how many bytes of weights
stream through the GPU per step and how many bytes of KV cache each token pins.

The built-in models are in :mod:`sim.catalog.models`; :func:`sim.catalog.hf_config.load_hf_config`
reads any other Hugging Face ``config.json`` from disk.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.catalog.hardware import bytes_per_element


@dataclass(frozen=True, slots=True)
class ModelArch:
    """A decoder-only transformer (Llama-style: RMSNorm, GQA attention, gated SiLU MLP), dense or
    a mixture of experts.

    Each layer holds q/k/v/o projections (k and v sized by ``num_key_value_heads``), a gated MLP
    of three ``hidden_size × intermediate_size`` matrices and two RMSNorm weight vectors; the model
    adds the token embedding, a final norm and, unless ``tie_word_embeddings``, a separate LM head.
    ``attention_bias`` adds biases to q, k and v (as Qwen2 does); ``attention_output_bias`` also
    to o (a Llama config with ``attention_bias: true`` biases all four); ``qk_norm`` adds an
    RMSNorm over each head's q and k (Qwen3). ``head_dim`` need not equal
    ``hidden_size / num_attention_heads``.

    A mixture of experts (``num_experts`` > 0, as Mixtral, Qwen-MoE and DeepSeek-MoE) replaces
    the MLP of every layer after the first ``num_dense_layers`` by a router (``hidden_size ×
    num_experts``), ``num_experts`` gated experts of width ``moe_intermediate_size`` of which
    each token uses ``num_experts_per_token``, and optionally an always-used shared expert of
    width ``shared_expert_intermediate_size``. Every expert's weights are in memory; a token
    computes only its own experts'.

    Multi-head latent attention (``kv_lora_rank`` > 0, DeepSeek-V2/V3) caches one latent vector
    of ``kv_lora_rank + qk_rope_head_dim`` elements per token and layer, shared by all heads,
    instead of a K and a V per KV head; ``head_dim`` is then the per-head query/key width
    without rotary (``qk_nope_head_dim``), ``v_head_dim`` the value width, and ``q_lora_rank``
    (0: none) a low-rank query projection. Invalid values raise ``ValueError`` naming the field.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    attention_bias: bool = False
    attention_output_bias: bool = False
    qk_norm: bool = False
    num_experts: int = 0
    num_experts_per_token: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    num_dense_layers: int = 0
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"ModelArch name must be a non-empty string, got {self.name!r}")
        positive_ints = (
            ("num_layers", self.num_layers),
            ("hidden_size", self.hidden_size),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("intermediate_size", self.intermediate_size),
            ("vocab_size", self.vocab_size),
            ("max_position_embeddings", self.max_position_embeddings),
        )
        for field_name, value in positive_ints:
            # bool is an int subclass; a flag in a size field is a transcription slip.
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(
                    f"ModelArch {self.name!r}: {field_name} must be a positive integer, "
                    f"got {value!r}; copy it from the model's config.json"
                )
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ValueError(
                f"ModelArch {self.name!r}: num_attention_heads ({self.num_attention_heads}) must "
                f"be a multiple of num_key_value_heads ({self.num_key_value_heads}) for grouped-"
                "query attention; check both against the model's config.json"
            )
        flags = (
            ("tie_word_embeddings", self.tie_word_embeddings),
            ("attention_bias", self.attention_bias),
            ("attention_output_bias", self.attention_output_bias),
            ("qk_norm", self.qk_norm),
        )
        for field_name, flag in flags:
            if not isinstance(flag, bool):
                raise ValueError(
                    f"ModelArch {self.name!r}: {field_name} must be true or false, got {flag!r}"
                )

        self._check_experts()
        self._check_latent_attention()

    def _check_counts(self, names: tuple[str, ...], zero_means: str) -> None:
        """Each of the fields ``names`` is an integer >= 0 (0 meaning ``zero_means``)."""
        for field_name in names:
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(
                    f"ModelArch {self.name!r}: {field_name} must be an integer >= 0, got "
                    f"{value!r}; copy it from the model's config.json (0: {zero_means})"
                )

    def _check_latent_attention(self) -> None:
        """Latent attention's fields are whole and come together."""
        self._check_counts(
            ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "v_head_dim"),
            "standard attention",
        )
        if self.kv_lora_rank and not (self.qk_rope_head_dim and self.v_head_dim):
            raise ValueError(
                f"ModelArch {self.name!r}: latent attention (kv_lora_rank) needs "
                "qk_rope_head_dim and v_head_dim from the model's config.json"
            )
        if not self.kv_lora_rank and (self.q_lora_rank or self.qk_rope_head_dim or self.v_head_dim):
            raise ValueError(
                f"ModelArch {self.name!r}: q_lora_rank, qk_rope_head_dim and v_head_dim describe "
                "latent attention; set kv_lora_rank too, or leave them 0"
            )

    @property
    def uses_latent_attention(self) -> bool:
        """Whether attention is multi-head latent attention (one latent KV vector per token)."""
        return self.kv_lora_rank > 0

    @property
    def kv_elements_per_token_per_layer(self) -> int:
        """Elements one token's KV cache holds per layer: K and V per KV head, or the latent."""
        if self.uses_latent_attention:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.num_key_value_heads * self.head_dim

    def kv_shards(self, tensor_parallel_size: int) -> int:
        """How many ways tensor parallelism splits the KV cache: by KV heads (replicated beyond
        their count), not at all for a latent, which every GPU keeps whole."""
        if self.uses_latent_attention:
            return 1
        return min(tensor_parallel_size, self.num_key_value_heads)

    def _check_experts(self) -> None:
        """A mixture of experts' fields are whole, non-negative and agree with each other."""
        names = (
            "num_experts",
            "num_experts_per_token",
            "moe_intermediate_size",
            "shared_expert_intermediate_size",
            "num_dense_layers",
        )
        self._check_counts(names, "a dense model")
        if not self.num_experts:
            if any(getattr(self, name) for name in names):
                raise ValueError(
                    f"ModelArch {self.name!r}: expert fields without num_experts; set "
                    "num_experts (a mixture of experts) or leave them all 0 (dense)"
                )
            return
        if not 1 <= self.num_experts_per_token <= self.num_experts:
            raise ValueError(
                f"ModelArch {self.name!r}: num_experts_per_token must be in 1..num_experts "
                f"({self.num_experts}), got {self.num_experts_per_token}"
            )
        if self.moe_intermediate_size <= 0:
            raise ValueError(
                f"ModelArch {self.name!r}: moe_intermediate_size (each expert's width) must be "
                "a positive integer for a mixture of experts"
            )
        if self.num_dense_layers >= self.num_layers:
            raise ValueError(
                f"ModelArch {self.name!r}: num_dense_layers ({self.num_dense_layers}) must be "
                f"below num_layers ({self.num_layers})"
            )

    @property
    def is_moe(self) -> bool:
        """Whether the model is a mixture of experts."""
        return self.num_experts > 0

    @property
    def num_moe_layers(self) -> int:
        """Layers whose MLP is a mixture of experts."""
        return self.num_layers - self.num_dense_layers if self.is_moe else 0

    @property
    def expert_params(self) -> int:
        """One routed expert of one layer: its gate, up and down projections."""
        return 3 * self.hidden_size * self.moe_intermediate_size

    @property
    def dense_linear_params(self) -> int:
        """Matrix weights every token multiplies by, all layers: the attention projections, the
        dense MLPs and, in mixture-of-experts layers, the router and the shared expert."""
        moe_common = self.hidden_size * self.num_experts
        moe_common += 3 * self.hidden_size * self.shared_expert_intermediate_size
        dense_layers = self.num_layers - self.num_moe_layers
        return (
            self.num_layers * self.attention_params_per_layer
            + dense_layers * self.mlp_params_per_layer
            + self.num_moe_layers * moe_common
        )

    @property
    def routed_linear_params(self) -> int:
        """Expert weights one token multiplies by, all layers: its ``k`` routed experts in
        every MoE layer (0 for a dense model)."""
        return self.num_experts_per_token * self.expert_params * self.num_moe_layers

    @property
    def active_linear_params(self) -> int:
        """Matrix weights one token multiplies by, all layers (its FLOPs are twice this)."""
        return self.dense_linear_params + self.routed_linear_params

    @property
    def total_linear_params(self) -> int:
        """Matrix weights held in memory, all layers: every expert's."""
        return (
            self.dense_linear_params + self.num_experts * self.expert_params * self.num_moe_layers
        )

    def expected_distinct_experts(self, num_tokens: int) -> float:
        """Experts of one layer that ``num_tokens`` tokens use between them, in expectation,
        under balanced routing (what load-balancing training aims for): each token picks
        ``num_experts_per_token`` of ``num_experts``, so an expert is missed by all of them with
        probability ``(1 - k/E) ** T``. One token reads k experts; a large batch reads them all."""
        if not self.is_moe or num_tokens <= 0:
            return 0.0
        missed = (1.0 - self.num_experts_per_token / self.num_experts) ** num_tokens
        return self.num_experts * (1.0 - missed)

    @property
    def active_intermediate_size(self) -> int:
        """The MLP width one token's activations pass through in a (mixture-of-experts) layer."""
        if not self.is_moe:
            return self.intermediate_size
        return (
            self.num_experts_per_token * self.moe_intermediate_size
            + self.shared_expert_intermediate_size
        )

    @property
    def attention_params_per_layer(self) -> int:
        """Weights (and biases, if any) of one layer's q, k, v and o projections; for latent
        attention its query, latent down- and up-projections, latent norm and output."""
        if self.uses_latent_attention:
            heads = self.num_attention_heads
            q_head = self.head_dim + self.qk_rope_head_dim
            if self.q_lora_rank:
                query = self.hidden_size * self.q_lora_rank + self.q_lora_rank
                query += self.q_lora_rank * heads * q_head
            else:
                query = self.hidden_size * heads * q_head
            down = self.hidden_size * (self.kv_lora_rank + self.qk_rope_head_dim)
            up = self.kv_lora_rank * heads * (self.head_dim + self.v_head_dim)
            out = heads * self.v_head_dim * self.hidden_size
            return query + down + self.kv_lora_rank + up + out
        q_width = self.num_attention_heads * self.head_dim
        kv_width = self.num_key_value_heads * self.head_dim
        weights = self.hidden_size * (q_width + 2 * kv_width) + q_width * self.hidden_size
        biases = (q_width + 2 * kv_width) if self.attention_bias else 0
        if self.attention_output_bias:
            biases += self.hidden_size
        return weights + biases

    @property
    def mlp_params_per_layer(self) -> int:
        """Weights of one layer's gate, up and down projections (no biases)."""
        return 3 * self.hidden_size * self.intermediate_size

    @property
    def linear_params_per_layer(self) -> int:
        """Parameters of one dense layer's matrix multiplies: attention projections plus MLP
        (a mixture of experts: :attr:`active_linear_params` and :attr:`total_linear_params`)."""
        return self.attention_params_per_layer + self.mlp_params_per_layer

    @property
    def embedding_params(self) -> int:
        """The token-embedding table, ``vocab_size × hidden_size``."""
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """The output projection: zero when it shares the embedding's weights."""
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        """All parameters: layers (linears, two RMSNorm vectors), embedding, LM head, final norm.

        Matches the checkpoint's tensor count exactly (Llama-3.1-8B: 8,030,261,248); a mixture
        of experts counts every expert.
        """
        norms = 2 * self.hidden_size + (2 * self.head_dim if self.qk_norm else 0)
        return (
            self.total_linear_params
            + self.num_layers * norms
            + self.embedding_params
            + self.lm_head_params
            + self.hidden_size
        )

    @property
    def num_active_params(self) -> int:
        """Parameters one token computes with: :attr:`num_params` less the experts it skips."""
        skipped = self.num_experts - self.num_experts_per_token
        return self.num_params - skipped * self.expert_params * self.num_moe_layers

    def weight_bytes(self, dtype: str) -> float:
        """Bytes of all weights stored uniformly in ``dtype``.

        Quantized checkpoints usually keep the embedding and LM head in 16 bits and add scales,
        so for ``'int4'``/``'fp8'`` this is a lower bound.
        """
        return self.num_params * bytes_per_element(dtype)

    def kv_bytes_per_token(self, kv_dtype: str) -> float:
        """KV-cache bytes one token occupies across all layers: a K and a V vector per KV head
        (or one latent vector)."""
        return (
            self.num_layers * self.kv_elements_per_token_per_layer * (bytes_per_element(kv_dtype))
        )
