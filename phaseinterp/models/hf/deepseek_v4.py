"""`HookedDeepseekV4`: Hugging Face's DeepSeek-V4 in phaseinterp's model protocol, with hooks.

The wrapper owns no weights: every parameter is the HF module's own. Its forward is a
line-by-line re-implementation of `transformers.models.deepseek_v4` (5.24, eager
attention, no KV cache) that calls the same submodules and parameters, with HookPoints
where the paper's quantities appear; it equals the plain HF forward to 1e-6. Hook names, shapes and the key layout of ``hook_pattern`` are phaseinterp's
one vocabulary (docs/hooks.md; TransformerLens's names where the concept matches): the
residual hooks carry the mHC ``hc_stream`` axis, K = V is one tensor (``attn.hook_kv``,
``compressor.hook_kv_compressed``; no ``hook_k``/``hook_v``), and the one compression gate per
layer is ``compressor.hook_gate_logits`` / ``hook_gate`` (an edit moves K and V alike).

Layout (``half``, ``slot``): a CSA token has two halves; half 0 (HF's ``Ca``, the first
``head_dim`` channels of ``kv_proj``/``gate_proj``/``position_bias``) feeds the entry in
which the token is among the OLDER S tokens, half 1 (``Cb``) the entry in which it is among
the newer S. Entry ``j`` reads positions ``jS + g .. jS + g + W - 1`` (those >= 0) with grid
start ``g = -S`` for CSA (W = 2S: slots ``0..S-1`` older, half 0, then ``S..2S-1`` newer, half
1; entry 0 is HF's leading partial entry over tokens ``0..S-1``, its older slots have logit
-inf, alpha 0) and ``g = 0`` for HCA (W = R, one half). An entry is visible from
``t >= jS + g + W - 1`` and (CSA) only if the indexer selects it; its key is rotated at
``jS + g + W - S`` (the own family's formulas with its window offset as ``g``).
Hooks only exist on compressed layers; sliding-window-only layers have no compressor.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional, Union

import einops
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
from transformer_lens.hook_points import HookPoint

from phaseinterp._checks import check_int, check_query_chunk, check_tensor
from phaseinterp._files import atomic_write, check_metadata, check_write_target, json_default, write_dir_atomically
from phaseinterp.errors import UserInputError
from phaseinterp.models.compressor import GateParameters
from phaseinterp.models.hf.attention import BlockHooks, NormHooks
from phaseinterp.models.hf.compressor import CompressorHooks
from phaseinterp.models.hf.config import DeepseekV4HookedConfig
from phaseinterp.models.hf.offload import execution_device, materialized
from phaseinterp.models.cache import KVCache, check_forward
from phaseinterp.models.paths import CheckedHooks, hooked_points, query_context
from phaseinterp.models.protocol import DeepseekV4Family, register_family
from phaseinterp.models.transformer import check_tokens

SIDECAR_FILE = "phaseinterp.json"  # phaseinterp metadata (task, recipe) beside an HF checkpoint


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------
class HookedDeepseekV4(CheckedHooks):
    """A ``transformers`` ``DeepseekV4ForCausalLM`` under phaseinterp's hooks and model protocol.

    ``model(tokens)`` returns logits ``[batch, pos, d_vocab]`` equal to the HF forward's;
    ``model(tokens, cache=model.init_cache())`` prefills and ``model(next, cache=cache)`` steps (the
    same numbers); ``run_with_hooks`` / ``run_with_cache`` / ``hooks()`` are TransformerLens's. The HF
    model is ``model.hf`` (weights shared, not copied).
    """

    def __init__(self, hf_model: nn.Module, name: Optional[str] = None):
        super().__init__()
        self.hf = hf_model
        self.cfg = DeepseekV4HookedConfig.from_hf(hf_model.config, name=name)
        self.metadata: dict[str, Any] = {}
        self.hook_embed = HookPoint()
        self.blocks = nn.ModuleList([BlockHooks(layer, i) for i, layer in enumerate(hf_model.model.layers)])
        self.ln_final = NormHooks(hf_model.model.norm)
        self.setup()
        self.cfg.device = str(self.device)

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        self.cfg.device = str(self.device)
        return out

    @property
    def device(self) -> torch.device:
        return execution_device(self.hf.model.embed_tokens)  # accelerate's execution device when offloaded

    # ------------------------------------------------------------ long prompts
    def set_query_chunk(self, query_chunk: Any) -> "HookedDeepseekV4":
        """How the attention runs its queries: ``"auto"`` (the default), None or an integer >= 1.

        Every layer's attention is one implementation (`attention.attend`), run per query chunk, each
        chunk against only the keys it can see (the band, the closed HCA entries, the CSA indexer's
        top-k per query, the indexer's own scores per chunk). ``"auto"``: chunks sized so the largest
        block of one prompt row stays within `chunking.SCORE_BLOCK` elements (a short prompt on a small
        model is one chunk; `chunking.LONG_SCORE_BLOCK` above `chunking.AUTO_CHUNK_ABOVE` tokens); the
        chunks depend on the length and the model, never on the batch size, and above
        `chunking.AUTO_CHUNK_ABOVE` (2,048) tokens the MLP/MoE and hyper-connections
        in blocks of `chunking.TOKEN_BLOCK` tokens: peak memory grows linearly in T. None: one chunk of
        every query (memory quadratic in T). An integer: chunks of that many queries. Every setting
        equals transformers' eager forward. Per-token hooks fire once with
        their full shapes; the per-query ``[pos, key_slot]`` hooks (``hook_attn_scores``,
        ``hook_pattern``, ``indexer.hook_scores``) fire once per chunk with ``ctx["query_range"]``
        (docs/deepseek_v4.md, "Long prompts on real checkpoints"). Returns the model."""
        query_chunk = check_query_chunk(query_chunk)
        for block in self.blocks:
            block.attn.query_chunk = query_chunk
            block.query_chunk = query_chunk
        return self

    @property
    def query_chunk(self) -> Any:
        """Queries per attention chunk (`set_query_chunk`): "auto", None (all at once) or a count."""
        return self.blocks[0].attn.query_chunk

    def get_caching_hooks(self, *args: Any, **kwargs: Any):
        """TransformerLens's caching hooks, made to join the chunks of a chunked forward: a per-query
        hook that fires once per query chunk (``ctx["query_range"]``) is cached as the whole
        ``[..., pos, key_slot]`` tensor, not as its last chunk."""
        cache, fwd, bwd = super().get_caching_hooks(*args, **kwargs)

        def joining(fn):
            def hook(tensor: Tensor, hook) -> None:
                span = hook.ctx.get("query_range")
                if span is None or span[0] == 0 or hook.name not in cache:
                    return fn(tensor, hook)
                previous = cache[hook.name]
                fn(tensor, hook)
                axis = 1 if hook.name.endswith("indexer.hook_scores") else -2
                if kwargs.get("remove_batch_dim") and axis == 1:
                    axis = 0
                cache[hook.name] = torch.cat([previous, cache[hook.name]], dim=axis)
            return hook

        return cache, [(name, joining(fn)) for name, fn in fwd], bwd

    # ---------------------------------------------------------------- forward
    def _check_tokens(self, tokens: Tensor, start: int = 0) -> None:
        n = self.cfg.n_ctx
        if isinstance(tokens, Tensor) and tokens.ndim == 2 and start + tokens.shape[1] > n:
            after = f" after the {start} cached" if start else ""
            raise UserInputError(f"a prompt of {tokens.shape[1]} tokens{after} exceeds the model's "
                                 f"max_position_embeddings={n} (valid lengths: 1..{n - start})")
        check_tokens(tokens, n, self.cfg.d_vocab, start)

    def init_cache(self) -> KVCache:
        """An empty cache for `forward` (prefill, then steps)."""
        return KVCache([None] * self.cfg.n_layers, layout=self.cache_layout)

    @property
    def cache_layout(self) -> str:
        """What shapes this model's cache (`KVCache.check` refuses a cache made for another)."""
        c = self.cfg
        return (f"d_model {c.d_model}, head dim {c.d_head}, window {c.sliding_window}, layers {c.layer_types}, "
                f"rates {c.compress_rates}, hc {c.hc_mult}")

    def forward(self, tokens: Tensor, *, cache: Optional[KVCache] = None, return_type: Optional[str] = "logits",
                start_at_layer: Optional[int] = None, stop_at_layer: Optional[int] = None,
                input_ids: Optional[Tensor] = None) -> Optional[Tensor]:
        """The one forward: logits ``[batch, pos, d_vocab]`` (``"logits"``), the mean next-token loss
        (``"loss"``) or None (``None``; ``"cache"``, a prefill that only fills ``cache``: the last layer
        computes what its cache keeps and stops there, its later hooks not firing on these positions),
        equal to transformers' eager forward.

        ``cache`` (`init_cache`): ``tokens`` continue the cached prefix and the cache is extended in
        place (prefill, then steps: the same numbers as one forward, every hook firing on the new
        positions only, ``hook.ctx["query_range"]`` saying which). A fork (`KVCache.fork`) takes one
        call, ``variants`` rows per cached row, and is not extended. ``start_at_layer`` /
        ``stop_at_layer`` (TransformerLens's): ``tokens`` is the mHC residual ``[batch, pos, hc_mult,
        d_model]`` entering ``start_at_layer`` (``hook_resid_pre``'s shape), and with ``stop_at_layer``
        the residual leaving ``stop_at_layer - 1`` is returned. ``input_ids``: with ``start_at_layer``,
        the token ids the hash-routed MoE layers among those run read (`layer_inputs`)."""
        n_layers = self.cfg.n_layers
        first, last, start, variants = check_forward(cache, return_type, n_layers, start_at_layer, stop_at_layer,
                                                     self.cache_layout)
        if start_at_layer is None and input_ids is not None:
            raise UserInputError("input_ids= goes with start_at_layer (the tokens are the input otherwise); drop it")
        hf = self.hf.model
        if start_at_layer is None:
            self._check_tokens(tokens, start)
            n = tokens.shape[1]
        else:
            streams = self._check_resid(tokens)
            n = streams.shape[1]
        if start + n > self.cfg.n_ctx:
            raise UserInputError(f"positions {start}..{start + n - 1} exceed the model's max_position_embeddings="
                                 f"{self.cfg.n_ctx}")
        if start_at_layer is not None:  # after the length: a too-long residual is named as one, not as tokens
            input_ids = self._check_input_ids(input_ids, streams, first, last)
        if cache is not None:
            cache.check_rows(tokens.shape[0], variants)
        # every hook of the call, the embedding and the final norm included, is told its positions
        with query_context(hooked_points(self).values(), start, start + n), KVCache.transaction(cache):
            if start_at_layer is None:
                input_ids = tokens = tokens.to(self.device).long()
                embeds = self.hook_embed(hf.embed_tokens(tokens))
                streams = embeds.unsqueeze(2).expand(-1, -1, self.cfg.hc_mult, -1).contiguous()
            position_ids = torch.arange(start, start + n, device=streams.device).unsqueeze(0)
            rope = {kind: hf.rotary_emb(streams, position_ids=position_ids, layer_type=kind)
                    for kind in ("main", "compress")}
            for layer in range(first, last):
                block = self.blocks[layer]
                device = execution_device(block.hf.input_layernorm)  # device_map: a decoder layer runs on one device
                if streams.device != device:
                    streams, position_ids = streams.to(device), position_ids.to(device)
                    rope = {k: (c.to(device), s.to(device)) for k, (c, s) in rope.items()}
                    input_ids = None if input_ids is None else input_ids.to(device)
                layer_cache = None if cache is None else cache.layers[layer]
                with materialized(block.hf):  # offloaded layer: its weights in memory for this layer only
                    streams, layer_cache = block(streams, rope, position_ids, input_ids, layer_cache, variants,
                                                 cache_only=return_type == "cache" and layer == n_layers - 1)
                if cache is not None and variants is None:
                    cache.layers[layer] = layer_cache
            if cache is not None:
                cache.after_call(variants, last == n_layers, start + n)
            if stop_at_layer is not None:
                return streams
            if return_type in (None, "cache"):
                return None
            streams = streams.to(execution_device(hf.norm))
            with materialized(hf.norm):  # ln_final reads the norm's weight directly
                final = self.ln_final(hf.hc_head(streams))
        logits = self.hf.lm_head(final.to(execution_device(self.hf.lm_head)))
        if return_type == "logits":
            return logits
        return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten().to(logits.device))

    def _check_resid(self, resid: Any) -> Tensor:
        check_tensor("the mHC residual (start_at_layer's input, hook_resid_pre's shape)", resid,
                     ("batch", "pos", self.cfg.hc_mult, self.cfg.d_model), self.hf.model.embed_tokens.weight.dtype)
        return resid.to(self.device)

    def _check_input_ids(self, input_ids: Any, streams: Tensor, first: int, last: int) -> Optional[Tensor]:
        """The token ids a ``start_at_layer`` call needs: those of its positions, where a hash-routed MoE
        layer is among ``first .. last - 1`` (refused missing there, and in a wrong shape anywhere)."""
        hashed = [layer for layer in range(first, last) if getattr(self.blocks[layer].hf.mlp, "is_hash", False)]
        if input_ids is None:
            if hashed:
                raise UserInputError(f"layers {hashed} route their MoE by token id: pass input_ids= [batch, pos] "
                                     "with start_at_layer (phase_model(model).layer_inputs(tokens))")
            return None
        if not isinstance(input_ids, Tensor) or tuple(input_ids.shape) != tuple(streams.shape[:2]):
            got = tuple(input_ids.shape) if isinstance(input_ids, Tensor) else type(input_ids).__name__
            raise UserInputError(f"input_ids= must be [batch, pos] = {tuple(streams.shape[:2])}, got {got}")
        check_tokens(input_ids, self.cfg.n_ctx, self.cfg.d_vocab)
        return input_ids.to(self.device).long()

    def last_logits(self, tokens: Tensor) -> Tensor:
        """The logits at the LAST position, ``model(tokens)[:, -1]``, as the cached forward computes them:
        a prefill of every position but the last, then one step on a fork of the cache. Every hook
        fires on both calls (docs/hooks.md, "The rule"). What `phase_profile` and gate cycling read."""
        self._check_tokens(tokens, 0)
        cache = self.init_cache()
        if tokens.shape[1] > 1:
            self(tokens[:, :-1], cache=cache, return_type="cache")
        return self(tokens[:, -1:], cache=cache.fork())[:, -1]

    # --------------------------------------------------------------- metadata
    def _compressor(self, layer: int) -> CompressorHooks:
        self._check_layer(layer)
        comp = self.blocks[layer].attn.compressor
        if not isinstance(comp, CompressorHooks):
            raise UserInputError(f"layer {layer} is a sliding-window-only layer (no compressor); compressed layers: "
                             f"{self.cfg.compressed_layers}")
        return comp

    def kv_head_groups(self) -> dict[int, list[int]]:
        """KV head -> the query heads that read it (one shared KV head: all of them)."""
        return self.cfg.kv_head_groups()

    def o_group_heads(self) -> list[list[int]]:
        """Query heads per output-projection group: pass as ``ablate(model, heads=...)`` for per-group units."""
        return self.cfg.o_group_heads()

    def position_bias(self, layer: int) -> nn.Parameter:
        """The per-slot gate bias of ``layer``'s compressor, HF's own parameter (edits write through):
        ``[S, 2 * d_head]`` for CSA (half 0 = channels ``:d_head``), ``[R, d_head]`` for HCA."""
        return self._compressor(layer).position_bias

    def gate_parameters(self, layer: int, branch: str = "k") -> GateParameters:
        """Per-slot gate parameters ``Z`` ``[slot, 1, d_head, d_model]`` (the ``gate_proj`` rows each slot
        uses) and ``b`` ``[slot, 1, d_head]`` (``position_bias`` laid out per slot, slot = half * S + i).
        Copies: edit `position_bias` to change the model. K = V, so both branches are the same gate."""
        if branch not in ("k", "v"):
            raise UserInputError(f"branch={branch!r} is not one of ('k', 'v')")
        comp = self._compressor(layer)
        S, d = comp.compress_rate, self.cfg.d_head
        halves = 2 if comp.two_halves else 1
        Z = einops.rearrange(comp.hf.gate_proj.weight.detach(), "(half d) m -> half d m", half=halves)
        Z = einops.repeat(Z, "half d m -> (half s) 1 d m", s=S)
        b = einops.rearrange(comp.position_bias.detach(), "s (half d) -> (half s) 1 d", half=halves, d=d)
        return GateParameters(Z=Z, b=b, kernel="deepseek", branch=branch)

    def entry_sources(self, layer: int, n_entries: int) -> list[list[int]]:
        """Source positions of each compressed entry of ``layer``: entry ``j`` reads ``jS + g ..
        jS + g + W - 1`` (those >= 0), grid start ``g = -S`` for CSA (entry 0 is HF's partial
        entry over tokens ``0..S-1``), 0 for HCA (docs/hooks.md)."""
        comp = self._compressor(layer)
        S = comp.compress_rate
        W, g = (2 * S, -S) if comp.two_halves else (S, 0)
        return [list(range(max(0, j * S + g), j * S + g + W)) for j in range(n_entries)]

    def key_slot_sources(self, layer: int, query_pos: int, n_key_slots: Optional[int] = None, *,
                         seq_len: Optional[int] = None) -> list[tuple[str, list[int]]]:
        """``(kind, source positions)`` of every key slot of ``hook_pattern`` / ``hook_attn_scores`` for one query.

        phaseinterp's key layout (docs/hooks.md): slots ``0..B-1`` (``B = sliding_window``) are the
        band, oldest first (slot ``s`` holds token ``query_pos - B + 1 + s``, ``"local"``, or
        ``"masked"`` before the sequence start), then slot ``B + j`` is compressed entry ``j``
        (``"entry"`` once closed, else ``"masked"``; see `entry_sources`). Whether the CSA indexer
        keeps a closed entry depends on the prompt: read ``indexer.hook_selected``. The entries
        listed: ``n_key_slots - B`` when given, else those of a ``seq_len``-token forward
        (``seq_len // S``), else the closed ones.
        """
        self._check_layer(layer)
        stride = self.cfg.layer_stride(layer)
        B = self.cfg.sliding_window
        if seq_len is not None:
            seq_len = check_int("seq_len", seq_len, 1)
        query_pos = check_int("query_pos", query_pos, 0, None if seq_len is None else seq_len - 1)
        if n_key_slots is not None:
            n_key_slots = check_int("n_key_slots", n_key_slots, B)
        if n_key_slots is not None and (stride is None and n_key_slots != B):
            raise UserInputError(f"n_key_slots={n_key_slots} does not fit layer {layer}'s key layout (the band of "
                                 f"{B} slots{'' if stride is None else ', then the entries'})")
        out = [("local", [p]) if p >= 0 else ("masked", []) for p in range(query_pos - B + 1, query_pos + 1)]
        if stride is None:
            return out
        closed = (query_pos + 1) // stride
        n_entries = n_key_slots - B if n_key_slots is not None else (closed if seq_len is None else seq_len // stride)
        for j, sources in enumerate(self.entry_sources(layer, n_entries)):
            out.append(("entry", sources) if j < closed else ("masked", []))
        return out

    def __repr__(self) -> str:
        n_params = sum(p.numel() for p in self.hf.parameters())
        return f"HookedDeepseekV4({self.cfg.label}, layers={self.cfg.n_layers}, params={n_params:,})"

    # ----------------------------------------------------------- checkpoints
    def save_pretrained(self, directory: Union[str, Path], metadata: Optional[dict] = None,
                        overwrite: bool = False) -> Path:
        """HF ``save_pretrained`` (safetensors + config.json) plus ``phaseinterp.json`` with ``metadata``,
        into a new folder moved into place in one rename; a previous HF checkpoint there is replaced
        only with ``overwrite=True``, anything else never (`phaseinterp._files.check_write_target`)."""
        meta = {**self.metadata, **check_metadata(metadata)}
        directory = check_write_target(directory, "Hugging Face checkpoint", overwrite=overwrite)

        def write(folder: Path) -> None:
            self.hf.save_pretrained(folder)
            atomic_write(folder / SIDECAR_FILE, json.dumps({"metadata": meta}, indent=2, default=json_default).encode())

        return write_dir_atomically(directory, write)


register_family(HookedDeepseekV4, DeepseekV4Family)
