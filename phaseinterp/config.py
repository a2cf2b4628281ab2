"""`CompressedConfig`: every architectural axis the phase-sensitivity paper sweeps."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Optional

from phaseinterp._checks import check_int, check_name, check_real, check_seed, plain_number
from phaseinterp.errors import UserInputError

COMPRESSION_KERNELS = ("gated", "deepseek")
GATE_TYPES = ("scalar", "vector", "uniform")
PAYLOADS = ("per_slot", "shared")
POSITIONALS = ("rope", "none")
MEMORY_POLICIES = ("local", "uncompressed_tail")
OFFSET_SHORTHANDS = ("staggered", "staggered_layers")


def _choice(name: str, value: Any, options: tuple) -> None:
    if value not in options:
        raise UserInputError(f"{name}={value!r} is not one of {options}")


@dataclass
class CompressedConfig:
    """A decoder-only transformer whose attention reads a chunk-compressed KV cache.

    Backbone (Qwen3-style): pre-RMSNorm, SwiGLU MLP, RoPE, optional QK-norm,
    grouped-query attention with ``n_kv_heads`` KV heads shared by
    ``n_heads // n_kv_heads`` query heads each.

    Compression (docs/science.md section 2): window ``window`` (W) tokens, a new window
    every ``stride`` (S) tokens, one cache entry per window.

    - ``compression``: ``"gated"`` (the paper's kernel: gate logits ``Z_i h + b_i``,
      payload maps ``C_i``), ``"deepseek"`` (DeepSeek-V4's ``kv_proj`` +
      ``gate_proj`` + per-slot ``position_bias``; W = S or the two-half layout W = 2S;
      the compressed entry serves as both key and value), or ``None`` for the
      full-attention baseline on the identical backbone.
    - ``gate``: ``"scalar"`` (one logit per KV head and slot), ``"vector"`` (one per
      channel), ``"uniform"`` (alpha = 1/W, no gate parameters).
    - ``gate_bias``: learn ``b_i`` (otherwise b_i = 0).
    - ``tie_kv_gates``: the K and V branches share one gate (Z, b).
    - ``payload``: ``"per_slot"`` (one map C_i per slot, as in docs/science.md) or
      ``"shared"`` (C_i = the per-token K/V projections for every slot).
    - ``positional``/``rope_dims``: RoPE on the first ``rope_dims`` dims of each head
      (``None`` = all of them) or no positional encoding.
    - ``memory``: ``"local"`` (exact K/V of the last ``local_window`` tokens, the
      query included) or ``"uncompressed_tail"`` (exact K/V only for tokens not yet
      covered by a closed window).
    - ``window_offsets``: staggered compression grids. KV head ``h`` of layer
      ``l`` compresses windows starting at ``j*S + o`` with ``o`` in ``0..S-1``: ``None``
      (all 0: the paper's shared grid), a sequence of ``n_kv_heads`` offsets (per KV head,
      every layer), ``n_layers`` sequences of ``n_kv_heads`` offsets (per layer and head),
      ``"staggered"`` (``o_h = h*S // n_kv_heads``; for one-KV-head models per layer,
      ``o_l = l*S // n_layers``) or ``"staggered_layers"`` (per layer, every head). Every
      head keeps the same number of entries, so memory per token is unchanged; tokens
      before a head's first window (``t < o``) are read only through the exact band.
    - ``tie_embeddings``: the unembedding is the embedding's transpose (``W_U = W_E.T``, as in
      Qwen3-0.6B); the embedding is then initialised at ``init_std`` instead of 1.
    """

    d_vocab: int = 128
    n_ctx: int = 256
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    d_head: int = 16
    d_mlp: int = 256
    compression: Optional[str] = "gated"
    window: int = 4
    stride: int = 4
    gate: str = "scalar"
    gate_bias: bool = True
    tie_kv_gates: bool = False
    payload: str = "per_slot"
    positional: str = "rope"
    rope_dims: Optional[int] = None
    rope_base: float = 10000.0
    qk_norm: bool = True
    memory: str = "local"
    local_window: int = 16
    norm_eps: float = 1e-6
    init_std: float = 0.02
    use_attn_result: bool = False
    window_offsets: Any = None
    tie_embeddings: bool = False
    seed: Optional[int] = 0
    # Not part of the architecture: set by the model so TransformerLens utilities that
    # read ``model.cfg.device`` allocate on the right device. Never serialized.
    device: Optional[str] = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # numpy numbers are taken, and stored as the Python ones they equal
            setattr(self, f.name, plain_number(getattr(self, f.name)))
        for name in ("d_vocab", "n_ctx", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_head", "d_mlp"):
            check_int(name, getattr(self, name), 1)
        if self.seed is not None:
            check_seed("seed", self.seed)
        if self.n_heads % self.n_kv_heads != 0:
            raise UserInputError(
                f"n_heads={self.n_heads} must be divisible by n_kv_heads={self.n_kv_heads} "
                f"(valid n_kv_heads: divisors of {self.n_heads})"
            )
        _choice("positional", self.positional, POSITIONALS)
        if self.rope_dims is not None:
            if self.positional == "none":
                raise UserInputError(f"rope_dims={self.rope_dims} is set but positional='none'")
            if (
                isinstance(self.rope_dims, bool)
                or not isinstance(self.rope_dims, int)
                or not (2 <= self.rope_dims <= self.d_head)
                or self.rope_dims % 2
            ):
                raise UserInputError(
                    f"rope_dims={self.rope_dims!r} must be an even integer in 2..{self.d_head} (d_head)"
                )
        if self.positional == "rope" and self.rotary_dims % 2:
            raise UserInputError(f"d_head={self.d_head} must be even for full RoPE; set rope_dims")
        check_real("rope_base", self.rope_base, 1.0, low_open=True)
        if not isinstance(self.tie_embeddings, bool):
            raise UserInputError(f"tie_embeddings={self.tie_embeddings!r} must be True or False")
        check_real("norm_eps", self.norm_eps, 0.0, low_open=True)
        check_real("init_std", self.init_std, 0.0, low_open=True, why=" (the std of the initial weights)")
        if self.compression is None:
            if self.window_offsets is not None:
                raise UserInputError(f"window_offsets={self.window_offsets!r} needs a compressed model (compression=None)")
            return
        _choice("compression", self.compression, COMPRESSION_KERNELS)
        check_int("stride", self.stride, 1)
        check_int("window", self.window, 1)
        if self.window < self.stride:
            raise UserInputError(
                f"window={self.window} must be >= stride={self.stride} (valid: window in {self.stride}..)"
            )
        _choice("gate", self.gate, GATE_TYPES)
        _choice("payload", self.payload, PAYLOADS)
        _choice("memory", self.memory, MEMORY_POLICIES)
        if self.memory == "local":
            check_int("local_window", self.local_window, 1)
        if self.compression == "deepseek":
            if self.window not in (self.stride, 2 * self.stride):
                raise UserInputError(
                    f"window={self.window} is not supported by the deepseek kernel with stride={self.stride} "
                    f"(valid: window={self.stride} or window={2 * self.stride})"
                )
            if self.gate != "vector":
                raise UserInputError(f"gate={self.gate!r}: the deepseek kernel always uses per-channel ('vector') gates")
        self._check_window_offsets()

    def _check_window_offsets(self) -> None:
        offsets = self.window_offsets
        if offsets is None or isinstance(offsets, str):
            if offsets is not None:
                _choice("window_offsets", offsets, OFFSET_SHORTHANDS)
            return
        if not isinstance(offsets, (list, tuple)):
            raise UserInputError(f"window_offsets={offsets!r} must be None, one of {OFFSET_SHORTHANDS} or a sequence")
        nested = len(offsets) > 0 and all(isinstance(o, (list, tuple)) for o in offsets)
        rows = [tuple(plain_number(v) for v in o) for o in offsets] if nested else [tuple(map(plain_number, offsets))]
        if nested and len(rows) != self.n_layers:
            raise UserInputError(f"window_offsets has {len(rows)} per-layer rows; the model has n_layers={self.n_layers}")
        for row in rows:
            if len(row) != self.n_kv_heads:
                raise UserInputError(
                    f"window_offsets {list(row)} has {len(row)} entries; need one per KV head (n_kv_heads="
                    f"{self.n_kv_heads})"
                )
            for o in row:
                if isinstance(o, bool) or not isinstance(o, int) or not (0 <= o < self.stride):
                    raise UserInputError(f"window offset {o!r} is out of range 0..{self.stride - 1} (stride={self.stride})")
        self.window_offsets = tuple(rows) if nested else rows[0]

    # ----------------------------------------------------------------- derived
    @property
    def is_compressed(self) -> bool:
        return self.compression is not None

    @property
    def group_size(self) -> int:
        """Query heads per KV head."""
        return self.n_heads // self.n_kv_heads

    @property
    def n_key_value_heads(self) -> int:
        """TransformerLens's name for ``n_kv_heads`` (read by ``transformer_lens.patching``)."""
        return self.n_kv_heads

    @property
    def rotary_dims(self) -> int:
        if self.positional == "none":
            return 0
        return self.d_head if self.rope_dims is None else self.rope_dims

    @property
    def n_halves(self) -> int:
        """DeepSeek kernel: 2 when W = 2S (each token feeds two entries), else 1."""
        return 2 if (self.compression == "deepseek" and self.window == 2 * self.stride) else 1

    def kv_head_groups(self) -> dict[int, list[int]]:
        """KV head -> the query heads that read it (query head q reads KV head q // group_size)."""
        g = self.group_size
        return {h: list(range(h * g, (h + 1) * g)) for h in range(self.n_kv_heads)}

    def layer_window_offsets(self, layer: int) -> tuple[int, ...]:
        """Window offset of each KV head in ``layer`` (see ``window_offsets``)."""
        o, S, KV = self.window_offsets, self.stride, self.n_kv_heads
        if o is None or not self.is_compressed:
            return (0,) * KV
        if o == "staggered" and KV > 1:
            return tuple(h * S // KV for h in range(KV))
        if o in OFFSET_SHORTHANDS:
            return (layer * S // self.n_layers,) * KV
        return tuple(o[layer]) if isinstance(o[0], tuple) else tuple(o)

    @property
    def is_staggered(self) -> bool:
        return any(any(self.layer_window_offsets(layer)) for layer in range(self.n_layers))

    @property
    def label(self) -> str:
        if not self.is_compressed:
            return "full attention"
        return f"W{self.window}/S{self.stride} {self.compression}" + (" staggered" if self.is_staggered else "")

    # ------------------------------------------------------------ (de)serialize
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("device")
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CompressedConfig":
        known = {f.name for f in dataclasses.fields(cls)} - {"device"}
        unknown = set(d) - known
        if unknown:
            raise UserInputError(f"unknown CompressedConfig fields {sorted(unknown)}; valid fields: {sorted(known)}")
        return cls(**{k: v for k, v in d.items() if k in known})

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def replace(self, **changes: Any) -> "CompressedConfig":
        return dataclasses.replace(self, **changes)


# ------------------------------------------------------------------ presets
QWEN3_VOCAB = 151_936

PRESETS: dict[str, dict[str, Any]] = {
    # Qwen3-0.6B's backbone (28 layers, d_model 1024, 16 query heads of 128, 8 KV heads, SwiGLU 3072, QK-norm,
    # tied embeddings, RoPE base 1e6) with the paper's compression: W = S = 8 scalar gates, shared payload maps,
    # a 16-token exact local window. `preset("qwen3-0.6b", compression=None)` is its full-attention twin.
    "qwen3-0.6b": dict(d_vocab=QWEN3_VOCAB, n_ctx=2048, d_model=1024, n_layers=28, n_heads=16, n_kv_heads=8,
                       d_head=128, d_mlp=3072, rope_base=1_000_000.0, tie_embeddings=True, window=8, stride=8,
                       gate="scalar", payload="shared", local_window=16),
    # The same family scaled to ~100M parameters at Qwen3's vocabulary (12 layers, d_model 512).
    "qwen3-100m": dict(d_vocab=QWEN3_VOCAB, n_ctx=2048, d_model=512, n_layers=12, n_heads=8, n_kv_heads=4,
                       d_head=64, d_mlp=1536, rope_base=1_000_000.0, tie_embeddings=True, window=8, stride=8,
                       gate="scalar", payload="shared", local_window=16),
    # What a 2-core CPU pretrains in half an hour (a trained BPE vocabulary of a few thousand tokens).
    "cpu-small": dict(d_vocab=4096, n_ctx=512, d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, d_head=32,
                      d_mlp=384, tie_embeddings=True, window=4, stride=4, gate="scalar", payload="shared",
                      local_window=16),
    # For tests: seconds per step on one CPU thread.
    "tiny": dict(d_vocab=512, n_ctx=128, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_head=8, d_mlp=64,
                 tie_embeddings=True, window=4, stride=4, gate="scalar", payload="shared", local_window=8),
}


def preset(name: str, **overrides: Any) -> CompressedConfig:
    """The named architecture (`PRESETS`) with ``overrides`` applied: the paper's sweep axes
    (``window``, ``stride``, ``n_kv_heads``, ``gate``, ``gate_bias``, ``payload``, ``positional``,
    ``memory``, ``local_window``, ``window_offsets``) or ``compression=None`` for the full twin.
    Unknown names and fields are refused, naming the valid ones."""
    check_name("preset", name, sorted(PRESETS))
    known = {f.name for f in dataclasses.fields(CompressedConfig)} - {"device"}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise UserInputError(f"preset overrides {unknown} are not CompressedConfig fields; valid fields: {sorted(known)}")
    return CompressedConfig(**{**PRESETS[name], **overrides})

