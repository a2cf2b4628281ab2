"""`HookedDeepseekV4`: Hugging Face's DeepSeek-V4 in phaseinterp's model protocol, with hooks.

The wrapper owns no weights: every parameter is the HF module's own. Its forward is a
line-by-line re-implementation of `transformers.models.deepseek_v4` (5.24, eager
attention, no KV cache) that calls the same submodules and parameters, with HookPoints
where the paper's quantities appear; tests/test_deepseek_v4.py checks it against the plain
HF forward to 1e-6. Hook names, shapes and the key layout of ``hook_pattern`` are phaseinterp's
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
from collections import Counter
from pathlib import Path
from typing import Any, Optional, Union

import einops
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
from transformer_lens.ActivationCache import ActivationCache
from transformer_lens.hook_points import HookPoint

from phaseinterp._checks import check_int, check_layer
from phaseinterp._files import atomic_write, check_metadata, check_write_target, json_default, write_dir_atomically
from phaseinterp.errors import UserInputError
from phaseinterp.models.compressor import GateParameters
from phaseinterp.models.hf.attention import BlockHooks, NormHooks
from phaseinterp.models.hf.chunking import check_query_chunk
from phaseinterp.models.hf.compressor import CompressorHooks
from phaseinterp.models.hf.config import DeepseekV4HookedConfig
from phaseinterp.models.hf.last_position import last_layer_at_p
from phaseinterp.models.hf.offload import execution_device, materialized
from phaseinterp.models.paths import CheckedHooks, last_logits_path, record_path
from phaseinterp.models.protocol import DeepseekV4Family, register_family
from phaseinterp.models.transformer import check_tokens

SIDECAR_FILE = "phaseinterp.json"  # phaseinterp metadata (task, recipe) beside an HF checkpoint


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------
class HookedDeepseekV4(CheckedHooks):
    """A ``transformers`` ``DeepseekV4ForCausalLM`` under phaseinterp's hooks and model protocol.

    ``model(tokens)`` returns logits ``[batch, pos, d_vocab]`` equal to the HF forward's;
    ``run_with_hooks`` / ``run_with_cache`` / ``hooks()`` are TransformerLens's. The HF model is
    ``model.hf`` (weights shared, not copied). No incremental cache: every call is a full forward.
    """

    def __init__(self, hf_model: nn.Module, name: Optional[str] = None):
        super().__init__()
        self.hf = hf_model
        self.cfg = DeepseekV4HookedConfig.from_hf(hf_model.config, name=name)
        self.metadata: dict[str, Any] = {}
        # runs of each `last_logits` / knockout path ("final", "last_position", "full"; models/paths.py)
        self.path_counts: Counter = Counter()
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
        equals transformers' eager forward (tests/test_dsv4_long.py). Per-token hooks fire once with
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
    def _check_tokens(self, tokens: Tensor) -> None:
        n = self.cfg.n_ctx
        if isinstance(tokens, Tensor) and tokens.ndim == 2 and tokens.shape[1] > n:
            raise UserInputError(f"a prompt of {tokens.shape[1]} tokens exceeds the model's max_position_embeddings="
                                 f"{n} (valid lengths: 1..{n})")
        check_tokens(tokens, n, self.cfg.d_vocab)

    def forward(self, tokens: Tensor, *, return_type: Optional[str] = "logits") -> Optional[Tensor]:
        """Logits ``[batch, pos, d_vocab]`` (``"logits"``), the mean next-token loss (``"loss"``) or None."""
        if return_type not in ("logits", "loss", None):
            raise UserInputError(f"return_type={return_type!r} is not one of ('logits', 'loss', None)")
        self._check_tokens(tokens)
        hf = self.hf.model
        streams, inputs = self._through(self.blocks, *self._decoder_inputs(tokens))
        tokens = inputs[0]
        streams = streams.to(execution_device(hf.norm))
        with materialized(hf.norm):  # ln_final reads the norm's weight directly
            final = self.ln_final(hf.hc_head(streams))
        if return_type is None:
            return None
        logits = self.hf.lm_head(final.to(execution_device(self.hf.lm_head)))
        if return_type == "logits":
            return logits
        return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten().to(logits.device))

    def _decoder_inputs(self, tokens: Tensor) -> tuple:
        """(tokens, streams entering layer 0, position ids, rope) of a forward over ``tokens``."""
        hf = self.hf.model
        tokens = tokens.to(self.device).long()
        embeds = self.hook_embed(hf.embed_tokens(tokens))
        position_ids = torch.arange(tokens.shape[1], device=embeds.device).unsqueeze(0)
        streams = embeds.unsqueeze(2).expand(-1, -1, self.cfg.hc_mult, -1).contiguous()
        rope = {kind: hf.rotary_emb(embeds, position_ids=position_ids, layer_type=kind) for kind in ("main", "compress")}
        return tokens, streams, position_ids, rope

    @staticmethod
    def _through(blocks, tokens, streams, position_ids, rope) -> tuple:
        """``streams`` through ``blocks`` (each on its execution device): (streams, the inputs moved along)."""
        for block in blocks:
            device = execution_device(block.hf.input_layernorm)  # device_map: a decoder layer runs on one device
            if streams.device != device:
                streams, position_ids = streams.to(device), position_ids.to(device)
                rope = {k: (c.to(device), s.to(device)) for k, (c, s) in rope.items()}
                tokens = tokens.to(device)
            with materialized(block.hf):  # offloaded layer: its weights in memory for this layer only
                streams = block(streams, rope, position_ids, tokens)
        return streams, (tokens, position_ids, rope)

    def last_logits(self, tokens: Tensor, *, path: str = "auto") -> Tensor:
        """The logits at the LAST position, ``model(tokens)[:, -1]`` (equal to 1e-5, tested), at less
        cost while no hook is attached. What `phase_profile` and gate cycling read. The path follows
        the hooks attached (`phaseinterp.models.paths`; counted in ``path_counts``): none: ``"final"``,
        every layer but the last over all positions, the last layer's K = V, compressed entries and
        indexer scores over all positions but its attention and MoE at the final position only
        (`models.hf.last_position`; offloaded layers are brought in as the forward brings them); any
        hook (or ``path="full"``): ``"full"``, the full forward, every hook on its full shape."""
        chosen = last_logits_path(self, path)
        record_path(self, chosen)
        if chosen == "full":
            return self(tokens)[:, -1]
        self._check_tokens(tokens)
        streams, (tokens, position_ids, rope) = self._through(self.blocks[:-1], *self._decoder_inputs(tokens))
        return last_layer_at_p(self, streams, tokens, position_ids, rope)[1]

    def run_with_cache(self, *model_args: Any, return_cache_object: bool = True, **kwargs: Any):
        """TransformerLens's ``run_with_cache`` (an ``ActivationCache`` unless ``return_cache_object=False``)."""
        out, cache_dict = super().run_with_cache(*model_args, **kwargs)
        if not return_cache_object:
            return out, cache_dict

        return out, ActivationCache(cache_dict, self, has_batch_dim=not kwargs.get("remove_batch_dim", False))

    # --------------------------------------------------------------- metadata
    def _check_layer(self, layer: int) -> None:
        check_layer(layer, self.cfg.n_layers)

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
