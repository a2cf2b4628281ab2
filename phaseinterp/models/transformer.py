"""`CompressedTransformer`: a hooked decoder-only transformer with a compressed KV cache.

Qwen3-shaped backbone (pre-RMSNorm, SwiGLU, RoPE, optional QK-norm, GQA); attention in
`phaseinterp.models.attention`, the compressor in `phaseinterp.models.compressor`.
Built on TransformerLens's `HookedRootModule`, so ``run_with_cache``,
``run_with_hooks`` and ``hooks()`` work unchanged. Hook names are the one vocabulary of both
model families (docs/hooks.md lists every hook with its shape; TransformerLens's names where
the concept matches):

    hook_embed                                         [batch, pos, d_model]
    blocks.{l}.hook_resid_pre / hook_resid_mid / hook_resid_post
    blocks.{l}.ln1.hook_normalized, blocks.{l}.ln2.hook_normalized
    blocks.{l}.attn.hook_q                             [batch, pos, head, d_head]
    blocks.{l}.attn.hook_k / hook_v                    [batch, pos, kv_head, d_head]  per token
    blocks.{l}.attn.hook_rot_q / hook_rot_k            after QK-norm + RoPE
    blocks.{l}.attn.compressor.hook_gate_logits_k/_v   [batch, entry, slot, kv_head(, d_head)]  separate gates
    blocks.{l}.attn.compressor.hook_gate_k/_v          alpha, same shape
    blocks.{l}.attn.compressor.hook_gate_logits / hook_gate   one gate for K and V (DeepSeek kernel, tied)
    blocks.{l}.attn.compressor.hook_k_compressed/_v_compressed  [batch, entry, kv_head, d_head]  gated kernel
    blocks.{l}.attn.compressor.hook_kv_compressed      the one K = V entry (DeepSeek kernel), before kv_norm
    blocks.{l}.attn.compressor.hook_rot_k_compressed / hook_rot_kv_compressed  the entry key after RoPE
    blocks.{l}.attn.hook_attn_scores / hook_pattern    [batch, head, query_pos, key_slot]  band, then entries
    blocks.{l}.attn.hook_z                             [batch, pos, head, d_head]
    blocks.{l}.attn.hook_result                        [batch, pos, head, d_model] (use_attn_result)
    blocks.{l}.hook_attn_out / hook_mlp_out            [batch, pos, d_model]
    blocks.{l}.mlp.hook_pre / hook_post                [batch, pos, d_mlp]
    ln_final.hook_normalized

With an incremental cache, hooks see only the new positions (and the newly closed
windows), ``hook.ctx["query_range"]`` saying which (docs/hooks.md, "The rule"): `last_logits` is a
prefill and one step, so a hook sees the prompt but its last position, then that position.
Query head ``q`` reads KV head ``q // (n_heads // n_kv_heads)``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Optional, Union

import einops
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint
from jaxtyping import Float, Int
from safetensors.torch import load as load_bytes, save as save_bytes
from torch import Tensor
from transformer_lens.hook_points import HookPoint

from phaseinterp._checks import check_device, check_query_chunk, check_tensor
from phaseinterp.errors import UserInputError
from phaseinterp._files import (atomic_write, check_metadata, check_read_path, check_write_target, write_dir_atomically)
from phaseinterp.config import CompressedConfig
from phaseinterp.models.attention import CompressedAttention
from phaseinterp.models.cache import KVCache, check_forward
from phaseinterp.models.compressor import GateParameters, RMSNorm
from phaseinterp.models.paths import CheckedHooks, has_hooks, hooked_points, query_context
from phaseinterp.models.protocol import CompressedFamily, register_family
from phaseinterp.phase import boundary_phase

CHECKPOINT_FORMAT = 1
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"


def check_tokens(tokens, n_ctx: int, d_vocab: int, start: int = 0) -> None:
    """Raise unless ``tokens`` is a non-empty integer [batch, pos] tensor of ids in 0..d_vocab-1
    whose positions ``start..start+pos-1`` fit in ``n_ctx`` (a `UserInputError` naming ``tokens`` and the value)."""
    if not isinstance(tokens, Tensor) or tokens.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
        raise UserInputError(f"tokens must be an integer tensor [batch, pos], got "
                             f"{getattr(tokens, 'dtype', type(tokens).__name__)}")
    if tokens.ndim != 2:
        raise UserInputError(f"tokens must have shape [batch, pos], got {tuple(tokens.shape)}")
    if tokens.shape[1] == 0:
        raise UserInputError("tokens has no positions (shape [batch, 0])")
    if tokens.shape[0] == 0:
        raise UserInputError(f"tokens has no sequences (shape [0, {tokens.shape[1]}]); pass at least one row")
    end = start + tokens.shape[1]
    if end > n_ctx:
        raise UserInputError(f"tokens: sequence length {end} exceeds n_ctx={n_ctx} (valid lengths: 1..{n_ctx})")
    lo, hi = int(tokens.min()), int(tokens.max())
    if lo < 0 or hi >= d_vocab:
        bad = lo if lo < 0 else hi
        raise UserInputError(f"tokens: token id {bad} is outside the vocabulary (valid ids: 0..{d_vocab - 1})")


class CheckpointError(UserInputError, RuntimeError):
    """A checkpoint directory is missing, truncated or corrupt: the user's file, so a `UserInputError`
    (one line, exit 2 on the command line); still a RuntimeError for callers that catch that."""


# Tokens per block of the MLP's rows while its hooks are idle (`SwiGLU.forward`): cache-sized blocks.
MLP_ROWS = 512


class SwiGLU(nn.Module):
    def __init__(self, cfg: CompressedConfig):
        super().__init__()
        self.W_gate = nn.Parameter(torch.zeros(cfg.d_model, cfg.d_mlp))
        self.W_in = nn.Parameter(torch.zeros(cfg.d_model, cfg.d_mlp))
        self.W_out = nn.Parameter(torch.zeros(cfg.d_mlp, cfg.d_model))
        self.hook_pre = HookPoint()
        self.hook_post = HookPoint()

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        """``(silu(x W_gate) * (x W_in)) W_out``.

        While no hook is attached to ``hook_pre``/``hook_post`` the rows run in blocks of `MLP_ROWS`
        tokens (bit for bit the same numbers: every row's maths is its own)."""
        if not (has_hooks(self.hook_pre) or has_hooks(self.hook_post)):
            flat = x.reshape(-1, x.shape[-1])
            if flat.shape[0] > MLP_ROWS:
                out = torch.cat([self._unhooked(flat[i : i + MLP_ROWS]) for i in range(0, flat.shape[0], MLP_ROWS)])
                return out.view(*x.shape[:-1], -1)
            return self._unhooked(x)
        post = F.silu(self.hook_pre(x @ self.W_gate)) * (x @ self.W_in)
        return self.hook_post(post) @ self.W_out

    def _unhooked(self, x: Tensor) -> Tensor:
        return (F.silu(x @ self.W_gate) * (x @ self.W_in)) @ self.W_out


class Block(nn.Module):
    def __init__(self, cfg: CompressedConfig, layer: int):
        super().__init__()
        self.ln1 = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = CompressedAttention(cfg, layer)
        self.ln2 = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = SwiGLU(cfg)
        self.hook_resid_pre = HookPoint()
        self.hook_attn_out = HookPoint()
        self.hook_resid_mid = HookPoint()
        self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(self, resid, cache=None, start: int = 0, variants: Optional[int] = None, cache_only: bool = False):
        resid = self.hook_resid_pre(resid)
        attn_out, layer_cache = self.attn(self.ln1(resid), cache, start, variants, cache_only)
        if cache_only:
            return resid, layer_cache
        resid = self.hook_resid_mid(resid + self.hook_attn_out(attn_out))
        resid = self.hook_resid_post(resid + self.hook_mlp_out(self.mlp(self.ln2(resid))))
        return resid, layer_cache


class CompressedTransformer(CheckedHooks):
    """Decoder-only transformer whose attention reads a chunk-compressed KV cache.

    ``model(tokens)`` returns logits ``[batch, pos, d_vocab]``; ``model(tokens,
    cache=cache)`` extends ``cache`` (see `init_cache`) by the new tokens and returns
    their logits only.
    """

    def __init__(self, cfg: CompressedConfig, device: Optional[Union[str, torch.device]] = None):
        super().__init__()
        if isinstance(cfg, dict):
            cfg = CompressedConfig.from_dict(cfg)
        if not isinstance(cfg, CompressedConfig):
            raise UserInputError(f"cfg={type(cfg).__name__} must be a CompressedConfig (or its dict)")
        if device is not None:
            device = check_device(device)  # before allocating any weights
        self.cfg = cfg.replace()
        self.metadata: dict[str, Any] = {}
        self.W_E = nn.Parameter(torch.zeros(cfg.d_vocab, cfg.d_model))
        self.hook_embed = HookPoint()
        self.blocks = nn.ModuleList([Block(self.cfg, layer) for layer in range(cfg.n_layers)])
        self.ln_final = RMSNorm(cfg.d_model, cfg.norm_eps)
        if not cfg.tie_embeddings:
            self.W_U = nn.Parameter(torch.zeros(cfg.d_model, cfg.d_vocab))
        # An execution setting (not in the config): recompute each block in the backward pass.
        self.activation_checkpointing = False
        self.reset_parameters(seed=cfg.seed)
        self.setup()
        self.cfg.device = str(self.W_E.device)
        if device is not None:
            self.to(device)
        self.eval()

    # ----------------------------------------------------------------- set-up
    def reset_parameters(self, seed: Optional[int] = 0) -> None:
        """Deterministic initialisation (N(0, init_std); output maps scaled by 1/sqrt(2 n_layers))."""
        gen = torch.Generator().manual_seed(0 if seed is None else seed)
        std = self.cfg.init_std
        with torch.no_grad():
            if self.cfg.tie_embeddings:
                self.W_E.normal_(0.0, std, generator=gen)
            else:
                self.W_E.normal_(0.0, 1.0, generator=gen)
                self.W_U.normal_(0.0, std, generator=gen)
            for block in self.blocks:
                block.attn.reset_parameters(gen, std)
                block.mlp.W_gate.normal_(0.0, std, generator=gen)
                block.mlp.W_in.normal_(0.0, std, generator=gen)
                block.mlp.W_out.normal_(0.0, std / (2 * self.cfg.n_layers) ** 0.5, generator=gen)

    @property
    def W_U(self) -> Float[Tensor, "d_model d_vocab"]:
        """The unembedding: its own parameter, or ``W_E.T`` when ``cfg.tie_embeddings``."""
        if "W_U" in self._parameters:
            return self._parameters["W_U"]
        if self.cfg.tie_embeddings:
            return self.W_E.T
        raise AttributeError("W_U")

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        self.cfg.device = str(self.W_E.device)
        return out

    @property
    def device(self) -> torch.device:
        return self.W_E.device

    def init_cache(self) -> KVCache:
        """An empty incremental-decoding cache."""
        return KVCache(layers=[None] * self.cfg.n_layers, length=0, layout=self.cache_layout)

    @property
    def cache_layout(self) -> str:
        """What shapes this model's cache (`KVCache.check` refuses a cache made for another)."""
        c = self.cfg
        return (f"d_model {c.d_model}, {c.n_kv_heads} KV heads of {c.d_head}, compression {c.compression}, "
                f"W {c.window}, S {c.stride}, offsets {c.window_offsets}")

    def set_query_chunk(self, query_chunk: Any) -> "CompressedTransformer":
        """How attention runs its queries: ``"auto"`` (the default), None or an integer >= 1.

        ``"auto"``: a forward over more than `attention.AUTO_CHUNK_ABOVE` (2,048) new tokens
        runs its queries in chunks sized so each chunk's score block stays within
        `attention.SCORE_BLOCK` elements; shorter inputs run in one pass. ``None``: every
        forward runs all queries at once (the whole ``[pos, key_slot]`` score matrix; memory
        quadratic in T). An integer: chunks of that many queries. Chunked outputs equal the
        unchunked ones (to 1e-5) and peak memory grows linearly in
        T. Every hook keeps its full shape: while a hook is attached to ``hook_attn_scores`` or
        ``hook_pattern`` (``run_with_cache`` without a ``names_filter`` attaches them) that
        layer runs unchunked, as those activations are ``[pos, key_slot]`` by nature. Not part
        of the config or checkpoint (an execution setting, like the device). Returns the model."""
        query_chunk = check_query_chunk(query_chunk)
        for block in self.blocks:
            block.attn.query_chunk = query_chunk
        return self

    @property
    def query_chunk(self) -> Union[int, str, None]:
        """Queries per attention chunk (`set_query_chunk`): "auto", None (all at once) or a count."""
        return self.blocks[0].attn.query_chunk

    # ---------------------------------------------------------------- forward
    def _check_tokens(self, tokens: Tensor, start: int) -> None:
        check_tokens(tokens, self.cfg.n_ctx, self.cfg.d_vocab, start)

    def forward(
        self,
        tokens: Union[Int[Tensor, "batch pos"], Float[Tensor, "batch pos d_model"]],
        *,
        cache: Optional[KVCache] = None,
        return_type: Optional[str] = "logits",
        start_at_layer: Optional[int] = None,
        stop_at_layer: Optional[int] = None,
    ) -> Optional[Tensor]:
        """The one forward: logits ``[batch, pos, d_vocab]`` (``return_type="logits"``), the mean
        next-token loss (``"loss"``) or nothing (``None``, for hooks only; ``"cache"``, a prefill that
        only fills ``cache``: the last layer computes its keys, values and entries and stops there, so
        its hooks after ``hook_rot_k`` do not fire on these positions).

        ``cache`` (`init_cache`): ``tokens`` continue the cached prefix and the cache is extended in
        place (prefill, then steps: the same numbers as one forward over the whole sequence, every
        hook firing on the new positions only, ``hook.ctx["query_range"]`` saying which). A fork of
        a cache (`KVCache.fork`) takes one call, ``variants`` rows per cached row, and is not extended.
        ``start_at_layer`` / ``stop_at_layer`` (TransformerLens's): ``tokens`` is the residual stream
        ``[batch, pos, d_model]`` entering ``start_at_layer``; the layers ``start_at_layer ..
        stop_at_layer - 1`` run (their caches extended) and with ``stop_at_layer`` the residual leaving
        them is returned.
        """
        n_layers = self.cfg.n_layers
        first, last, start, variants = check_forward(cache, return_type, n_layers, start_at_layer, stop_at_layer,
                                                     self.cache_layout)
        if start_at_layer is None:
            self._check_tokens(tokens, start)
        else:
            tokens = self._check_resid(tokens)
        n = tokens.shape[1]
        if start + n > self.cfg.n_ctx:
            raise UserInputError(f"positions {start}..{start + n - 1} exceed the model's n_ctx={self.cfg.n_ctx}")
        if cache is not None:
            cache.check_rows(tokens.shape[0], variants)
        # every hook of the call, the embedding and the final norm included, is told its positions
        with query_context(hooked_points(self).values(), start, start + n), KVCache.transaction(cache):
            if start_at_layer is None:
                tokens = tokens.to(self.W_E.device).long()
                resid = self.hook_embed(self.W_E[tokens])
            else:
                resid = tokens
            recompute = self.activation_checkpointing and cache is None and torch.is_grad_enabled()
            for layer in range(first, last):
                block = self.blocks[layer]
                layer_cache = cache.layers[layer] if cache is not None else None
                if recompute:  # the same block forward, hooks included, run again in the backward pass
                    resid, new_layer_cache = torch.utils.checkpoint.checkpoint(block, resid, None, start,
                                                                               use_reentrant=False)
                else:
                    cache_only = return_type == "cache" and layer == n_layers - 1
                    resid, new_layer_cache = block(resid, layer_cache, start, variants, cache_only)
                if cache is not None and variants is None:
                    cache.layers[layer] = new_layer_cache
            if cache is not None:
                cache.after_call(variants, last == n_layers, start + n)
            if stop_at_layer is not None:
                return resid
            if return_type in (None, "cache"):
                return None
            logits = self.ln_final(resid) @ self.W_U
        if return_type == "logits":
            return logits
        return F.cross_entropy(
            einops.rearrange(logits[:, :-1], "b t v -> (b t) v"), einops.rearrange(tokens[:, 1:], "b t -> (b t)")
        )

    def _check_resid(self, resid: Any) -> Tensor:
        check_tensor("the residual stream (start_at_layer's input)", resid, ("batch", "pos", self.cfg.d_model),
                     self.W_E.dtype)
        return resid.to(self.W_E.device)

    def last_logits(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch d_vocab"]:
        """The logits at the LAST position, ``model(tokens)[:, -1]``, as the cached forward computes
        them: a prefill of every position but the last (``return_type="cache"``), then one step (on a
        fork of the cache, so nothing is copied). Hooks fire on both calls (docs/hooks.md, "The rule"). What
        `phase_profile` and gate cycling read: one answer per prompt."""
        self._check_tokens(tokens, 0)
        if tokens.shape[1] == 1:
            return self(tokens)[:, -1]
        cache = self.init_cache()
        self(tokens[:, :-1], cache=cache, return_type="cache")
        return self(tokens[:, -1:], cache=cache.fork())[:, -1]

    def unembed(self, resid: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_vocab"]:
        """Final norm + unembedding (no hooks)."""
        return self.ln_final.unhooked(resid) @ self.W_U

    # --------------------------------------------------------------- metadata
    def kv_head_groups(self) -> dict[int, list[int]]:
        """KV head -> the query heads that read it."""
        return self.cfg.kv_head_groups()

    def window_offsets(self, layer: int) -> tuple[int, ...]:
        """Window offset ``o`` of each KV head of ``layer``: its windows start at ``j*S + o``."""
        self._check_layer(layer)
        return self.cfg.layer_window_offsets(layer)

    def boundary_phases(self, layer: int) -> tuple[int, ...]:
        """Per KV head of ``layer``: the phase ``t mod S`` of the positions that close its windows,
        its boundary phase (``(o + S - 1) mod S``; ``S - 1`` for every head on the shared grid).
        The phase profile keeps reporting phases of the shared stride, ``t mod S``."""
        if not self.cfg.is_compressed:
            raise UserInputError("the full-attention model (compression=None) has no compression windows")
        return tuple(boundary_phase(self.cfg.stride, o) for o in self.window_offsets(layer))

    def gate_parameters(self, layer: int, branch: str = "k") -> GateParameters:
        """The per-slot gate parameters ``Z``, ``b`` of one layer and branch (see `GateParameters`)."""
        self._check_layer(layer)
        if not self.cfg.is_compressed:
            raise UserInputError("the full-attention model (compression=None) has no gates")
        return self.blocks[layer].attn.compressor.gate_parameters(branch)

    def key_slot_sources(self, layer: int, query_pos: int, n_key_slots: Optional[int] = None, kv_head: int = 0):
        """``(kind, source positions)`` of each key slot of ``hook_pattern`` for one query reading
        ``kv_head`` (the KV heads differ only when their windows are staggered)."""
        self._check_layer(layer)
        return self.blocks[layer].attn.key_slot_sources(query_pos, n_key_slots, kv_head)

    def __repr__(self) -> str:
        n_params = sum(p.numel() for p in self.parameters())
        return f"CompressedTransformer({self.cfg.label}, layers={self.cfg.n_layers}, params={n_params:,})"

    # ----------------------------------------------------------- checkpoints
    def save_pretrained(self, directory: Union[str, Path], metadata: Optional[dict] = None,
                        overwrite: bool = False) -> Path:
        """Write ``model.safetensors`` + ``config.json`` into a new folder, moved into place in one
        rename (`phaseinterp._files.write_dir_atomically`).

        The config records the weights' SHA-256, so a truncated or corrupt file is reported on load
        instead of being loaded. ``directory`` must not exist or be empty; a previous phaseinterp
        checkpoint there is replaced only with ``overwrite=True``, anything else never
        (`phaseinterp._files.check_write_target`).
        """
        metadata = check_metadata(metadata)
        directory = check_write_target(directory, "phaseinterp checkpoint", overwrite=overwrite)
        blob, config = self.checkpoint_files(metadata)

        def write(folder: Path) -> None:
            atomic_write(folder / WEIGHTS_FILE, blob)
            atomic_write(folder / CONFIG_FILE, config)

        return write_dir_atomically(directory, write)

    def checkpoint_files(self, metadata: Optional[dict] = None) -> tuple[bytes, bytes]:
        """The bytes of ``model.safetensors`` and of ``config.json`` (which records the weights' size
        and SHA-256), as `save_pretrained` writes them."""
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in self.state_dict().items()}
        blob = save_bytes(tensors)
        meta = dict(self.metadata)
        meta.update(check_metadata(metadata))
        config = {
            "format": CHECKPOINT_FORMAT,
            "model": self.cfg.to_dict(),
            "weights_sha256": hashlib.sha256(blob).hexdigest(),
            "weights_bytes": len(blob),
            "metadata": meta,
        }
        config["config_sha256"] = config_hash(config)
        return blob, json.dumps(config, indent=2, sort_keys=True).encode()

    @classmethod
    def from_pretrained(
        cls, directory: Union[str, Path], device: Optional[Union[str, torch.device]] = None
    ) -> "CompressedTransformer":
        """Load a directory written by `save_pretrained`; verifies size and checksum first."""
        device = check_device(device)  # before reading any weights

        directory = check_read_path(directory, f"a phaseinterp checkpoint folder ({CONFIG_FILE} + {WEIGHTS_FILE}, "
                                               "written by save_pretrained)", name="directory")
        config_path, weights_path = directory / CONFIG_FILE, directory / WEIGHTS_FILE
        for path in (config_path, weights_path):
            if not path.is_file():
                raise CheckpointError(f"{path} does not exist: not a phaseinterp checkpoint directory")
        try:
            config = json.loads(config_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise CheckpointError(f"{config_path} is not valid JSON (truncated or corrupt): {err}") from None
        if not isinstance(config, dict):
            raise CheckpointError(f"{config_path} holds a {type(config).__name__}, not a checkpoint config")
        if config.get("format") != CHECKPOINT_FORMAT:
            if "model_type" in config:  # another loader's folder: say which one takes it
                raise CheckpointError(f"{directory} holds a Hugging Face checkpoint (model_type="
                                      f"{config['model_type']!r}), not a phaseinterp checkpoint: load it with "
                                      "phaseinterp.load_hf (or pass the folder to the CLI / report.load_model)")
            raise CheckpointError(f"{config_path}: unsupported checkpoint format {config.get('format')!r} (a "
                                  f"phaseinterp checkpoint has format {CHECKPOINT_FORMAT}, written by save_pretrained)")
        missing = [k for k in ("model", "weights_bytes", "weights_sha256") if k not in config]
        if missing:
            raise CheckpointError(f"{config_path} lacks the field(s) {missing}: truncated or not written by save_pretrained")
        blob = weights_path.read_bytes()
        if len(blob) != config["weights_bytes"]:
            raise CheckpointError(
                f"{weights_path} has {len(blob)} bytes but the config records {config['weights_bytes']}: "
                "the file is truncated or was replaced"
            )
        if hashlib.sha256(blob).hexdigest() != config["weights_sha256"]:
            raise CheckpointError(f"{weights_path} does not match its recorded SHA-256: the file is corrupt")
        if "config_sha256" in config and config["config_sha256"] != config_hash(config):
            raise CheckpointError(f"{config_path} was changed after it was saved (its architecture, metadata or task no "
                                  "longer match the config_sha256 recorded by save_pretrained): the model would run "
                                  "with settings it was not trained with")
        try:
            model = cls(CompressedConfig.from_dict(config["model"]))
        except (TypeError, ValueError, KeyError) as err:
            raise CheckpointError(f"{config_path}: invalid model config: {err}") from None
        try:
            model.load_state_dict(load_bytes(blob))
        except RuntimeError as err:  # shapes or names disagree with the config
            first = str(err).strip().splitlines()
            detail = next((line.strip() for line in first[1:] if line.strip()), first[0] if first else "")
            raise CheckpointError(
                f"{weights_path} does not fit the model described by {config_path}: {detail}") from None
        model.metadata = dict(config.get("metadata", {}))
        if device is not None:
            model.to(device)
        return model



def config_hash(config: dict) -> str:
    """SHA-256 of a checkpoint's config.json entries but this hash: the architecture, the weights' hash and
    the metadata (the stored task included), so an edited config is refused on load."""
    body = {k: v for k, v in config.items() if k != "config_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def parameter_count(config: CompressedConfig) -> int:
    """Parameters of ``CompressedTransformer(config)``, counted on the meta device (no memory)."""
    with torch.device("meta"):
        model = CompressedTransformer(config)
    return sum(p.numel() for p in model.parameters())


register_family(CompressedTransformer, CompressedFamily)
