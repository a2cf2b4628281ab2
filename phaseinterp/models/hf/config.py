"""`DeepseekV4HookedConfig`: what phaseinterp's experiments read from ``model.cfg``, from an HF DeepSeek-V4 config."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import transformers  # already loaded with transformer-lens; its DeepSeek-V4 classes load on first use

CSA, HCA, SLIDING = "compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"


@dataclass
class DeepseekV4HookedConfig:
    """What phaseinterp's experiments read from ``model.cfg``, derived from the HF config.

    ``stride`` is the phase-defining stride: the CSA compress rate when the model has CSA
    layers (V4: 4, V4.1: 2), else the HCA rate; ``window`` is 2 * stride for CSA (the
    two-half overlapping layout), else the stride. One shared KV head per layer (K = V).
    Per-layer rates: `DeepseekV4HookedConfig.layer_stride`.
    """

    d_vocab: int
    n_ctx: int
    d_model: int
    n_layers: int
    n_heads: int
    d_head: int
    rotary_dims: int
    layer_types: tuple[str, ...]
    compress_rates: dict[str, int]
    sliding_window: int
    index_topk: int
    o_groups: int
    hc_mult: int
    n_kv_heads: int = 1
    compression: Optional[str] = "deepseek"
    gate: str = "vector"
    gate_bias: bool = True
    tie_kv_gates: bool = True
    payload: str = "shared"
    memory: str = "local"
    name: str = "DeepSeek-V4"
    device: Optional[str] = field(default=None, compare=False, repr=False)

    @classmethod
    def from_hf(cls, config: Any, name: Optional[str] = None) -> "DeepseekV4HookedConfig":
        kinds = tuple(config.layer_types)
        compressed = any(k != SLIDING for k in kinds)
        return cls(
            d_vocab=int(config.vocab_size), n_ctx=int(config.max_position_embeddings), d_model=int(config.hidden_size),
            n_layers=int(config.num_hidden_layers), n_heads=int(config.num_attention_heads),
            d_head=int(config.head_dim), rotary_dims=int(config.qk_rope_head_dim), layer_types=kinds,
            compress_rates={k: int(v) for k, v in config.compress_rates.items()},
            sliding_window=int(config.sliding_window), index_topk=int(config.index_topk),
            o_groups=int(config.o_groups), hc_mult=int(config.hc_mult),
            compression="deepseek" if compressed else None,
            name=name or getattr(config, "name_or_path", None) or "DeepSeek-V4",
        )

    # ----------------------------------------------------------- derived
    @property
    def is_compressed(self) -> bool:
        return self.compression is not None

    @property
    def stride(self) -> int:
        if CSA in self.layer_types:
            return self.compress_rates[CSA]
        if HCA in self.layer_types:
            return self.compress_rates[HCA]
        return self.compress_rates.get(CSA, 4)  # sliding-only: the reference stride for folding phases

    @property
    def window(self) -> int:
        return 2 * self.stride if CSA in self.layer_types else self.stride

    @property
    def local_window(self) -> int:
        return self.sliding_window

    def layer_stride(self, layer: int) -> Optional[int]:
        """Compress rate of ``layer`` (None for a sliding-window-only layer)."""
        kind = self.layer_types[layer]
        return None if kind == SLIDING else self.compress_rates[kind]

    def layer_window(self, layer: int) -> Optional[int]:
        """Slots per entry of ``layer``: 2S for CSA, R for HCA, None for sliding-only."""
        s = self.layer_stride(layer)
        return None if s is None else (2 * s if self.layer_types[layer] == CSA else s)

    @property
    def compressed_layers(self) -> list[int]:
        return [i for i, k in enumerate(self.layer_types) if k != SLIDING]

    @property
    def group_size(self) -> int:
        return self.n_heads

    @property
    def n_key_value_heads(self) -> int:
        return self.n_kv_heads

    window_offsets = None  # HF windows start at position 0 in every layer (no staggered grids)

    def layer_window_offsets(self, layer: int) -> tuple[int, ...]:
        """Window-grid offset of each KV head of ``layer``: always 0 (one shared grid, as in HF)."""
        return (0,) * self.n_kv_heads

    @property
    def is_staggered(self) -> bool:
        return False

    def kv_head_groups(self) -> dict[int, list[int]]:
        """One shared KV head per layer: every query head reads it."""
        return {0: list(range(self.n_heads))}

    def o_group_heads(self) -> list[list[int]]:
        """The query heads of each output-projection group (``o_groups`` contiguous blocks)."""
        g = self.n_heads // self.o_groups
        return [list(range(i * g, (i + 1) * g)) for i in range(self.o_groups)]

    @property
    def label(self) -> str:
        counts = {k: self.layer_types.count(k) for k in (CSA, HCA, SLIDING) if k in self.layer_types}
        parts = [f"{n} {'CSA' if k == CSA else 'HCA' if k == HCA else 'SWA'}" for k, n in counts.items()]
        rates = f"S={self.stride}" if self.is_compressed else "no compression"
        return f"{self.name} ({rates}; {', '.join(parts)})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "d_vocab": self.d_vocab, "n_ctx": self.n_ctx, "d_model": self.d_model, "n_layers": self.n_layers,
            "n_heads": self.n_heads, "d_head": self.d_head, "stride": self.stride, "window": self.window,
            "layer_types": list(self.layer_types), "compress_rates": dict(self.compress_rates),
            "sliding_window": self.sliding_window, "index_topk": self.index_topk, "o_groups": self.o_groups,
            "hc_mult": self.hc_mult,
        }


def transformers_v4() -> Any:
    """`transformers`, checked to hold DeepSeek-V4 (>= 5.24, the [hf] extra; transformer-lens accepts
    older ones): ``transformers_v4().DeepseekV4ForCausalLM`` imports the model's code on first use."""
    if not hasattr(transformers, "DeepseekV4Config"):
        raise ImportError(f"DeepSeek-V4 support needs transformers>=5.24, found {transformers.__version__} "
                          "(pip install 'phaseinterp[hf]')")
    return transformers


def config_from_dict(raw: dict) -> Any:
    """A ``DeepseekV4Config`` from a ``config.json``'s fields: the architecture only (the
    ``quantization_config`` is a quantizer's packing, not a shape; legacy release fields such as
    ``compress_rate_csa`` or ``num_hash_layers`` fold in as transformers does)."""
    fields = {k: v for k, v in raw.items() if k not in ("architectures", "model_type", "transformers_version",
                                                         "quantization_config", "expert_dtype")}
    return transformers_v4().DeepseekV4Config(**fields)
