"""`HookedDeepseekV4`: Hugging Face's DeepSeek-V4 in phaseinterp's model protocol, with hooks.

The wrapper owns no weights: every parameter is the HF module's own. Its forward is a
line-by-line re-implementation of `transformers.models.deepseek_v4` (5.24, eager
attention, no KV cache) that calls the same submodules and parameters, with HookPoints
where the paper's quantities appear; tests/test_deepseek_v4.py checks it against the plain
HF forward to 1e-6. Hook names (TransformerLens's where the concept matches):

    hook_embed                                     [batch, pos, d_model]
    blocks.{l}.hook_resid_pre / _mid / _post       [batch, pos, hc_stream, d_model]  (mHC: hc_mult streams)
    blocks.{l}.hook_attn_in / hook_mlp_in          [batch, pos, d_model]  collapsed + RMS-normed block input
    blocks.{l}.hook_attn_out / hook_mlp_out        [batch, pos, d_model]
    blocks.{l}.attn.hook_q / hook_rot_q            [batch, pos, head, d_head]   (before / after RoPE)
    blocks.{l}.attn.hook_kv / hook_rot_kv          [batch, pos, kv_head=1, d_head]  per-token K = V
    blocks.{l}.attn.hook_attn_scores / hook_pattern  [batch, head, query_pos, key_slot]  (sink dropped)
    blocks.{l}.attn.hook_z                         [batch, pos, head, d_head]  before the output projection
    blocks.{l}.attn.compressor.hook_kv             [batch, pos, half, d_head]   per-token payload (kv_proj)
    blocks.{l}.attn.compressor.hook_token_gate_logits  [batch, pos, half, d_head]  gate_proj, before position_bias
    blocks.{l}.attn.compressor.hook_gate_logits_k/_v   [batch, entry, slot, kv_head=1, d_head]  + position_bias
    blocks.{l}.attn.compressor.hook_gate_k/_v      alpha, same shape (softmax over slot)
    blocks.{l}.attn.compressor.hook_compressed     [batch, entry, kv_head=1, d_head]  after kv_norm, before RoPE
    blocks.{l}.attn.compressor.hook_rot_compressed the same after RoPE (what attention reads)
    blocks.{l}.attn.compressor.indexer.hook_kv / hook_token_gate_logits / hook_gate_logits / hook_gate
    blocks.{l}.attn.compressor.indexer.hook_compressed / hook_rot_compressed  [batch, entry, d_index]
    blocks.{l}.attn.compressor.indexer.hook_q      [batch, pos, index_head, d_index]
    blocks.{l}.attn.compressor.indexer.hook_scores [batch, pos, entry]  (-inf for entries not yet closed)
    blocks.{l}.attn.compressor.indexer.hook_selected  [batch, pos, top_k] int64, -1 = no entry
    hook_final                                     [batch, pos, d_model]  hc_head + final norm

Layout (``half``, ``slot``): a CSA token has two halves; half 0 (HF's ``Ca``, the first
``head_dim`` channels of ``kv_proj``/``gate_proj``/``position_bias``) feeds the entry in
which the token is among the OLDER S tokens, half 1 (``Cb``) the entry in which it is among
the newer S. CSA entry ``j`` covers positions ``(j-1)S .. jS+S-1`` with slots ``0..S-1``
(older, half 0) then ``S..2S-1`` (newer, half 1); entry 0 is HF's leading partial entry
(tokens ``0..S-1``, newer half only; its older slots have logit -inf, alpha 0). HCA entry
``j`` covers ``jR .. jR+R-1`` (one half, R slots). An entry is visible from ``t >= (j+1)S - 1``
and (CSA) only if the indexer selects it. K = V: ``hook_gate_*_k`` and ``_v`` are one gate
seen twice (``_v`` receives ``_k``'s output), so tools written for separate K/V gates run.
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
from transformer_lens.HookedRootModule import HookedRootModule

from phaseinterp.errors import UserInputError
from phaseinterp.models.compressor import GateParameters
from phaseinterp.models.hf.attention import AttentionHooks, BlockHooks  # noqa: F401 - AttentionHooks re-exported
from phaseinterp.models.hf.compressor import (  # noqa: F401 - re-exported from their former home
    CompressorHooks,
    IndexerHooks,
    _CompressionHooks,
    _hf,
    _NoCompressor,
)
from phaseinterp.models.hf.config import CSA, HCA, SLIDING, DeepseekV4HookedConfig  # noqa: F401
from phaseinterp.models.hf.offload import execution_device, materialized

SIDECAR_FILE = "phaseinterp.json"  # phaseinterp metadata (task, recipe) beside an HF checkpoint


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------
class HookedDeepseekV4(HookedRootModule):
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
        self.hook_embed = HookPoint()
        self.blocks = nn.ModuleList([BlockHooks(layer, i) for i, layer in enumerate(hf_model.model.layers)])
        self.hook_final = HookPoint()
        self.setup()
        self.cfg.device = str(self.device)

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        self.cfg.device = str(self.device)
        return out

    @property
    def device(self) -> torch.device:
        return execution_device(self.hf.model.embed_tokens)  # accelerate's execution device when offloaded

    # ---------------------------------------------------------------- forward
    def _check_tokens(self, tokens: Tensor) -> None:
        from phaseinterp.models.transformer import check_tokens

        check_tokens(tokens, self.cfg.n_ctx, self.cfg.d_vocab)

    def forward(self, tokens: Tensor, *, return_type: Optional[str] = "logits") -> Optional[Tensor]:
        """Logits ``[batch, pos, d_vocab]`` (``"logits"``), the mean next-token loss (``"loss"``) or None."""
        if return_type not in ("logits", "loss", None):
            raise UserInputError(f"return_type={return_type!r} is not one of ('logits', 'loss', None)")
        self._check_tokens(tokens)
        from transformers.masking_utils import create_sliding_window_causal_mask

        hf = self.hf.model
        tokens = tokens.to(self.device).long()
        embeds = self.hook_embed(hf.embed_tokens(tokens))
        position_ids = torch.arange(tokens.shape[1], device=embeds.device).unsqueeze(0)
        mask = create_sliding_window_causal_mask(config=hf.config, inputs_embeds=embeds, attention_mask=None,
                                                 cache=None, position_ids=position_ids)
        streams = embeds.unsqueeze(2).expand(-1, -1, self.cfg.hc_mult, -1).contiguous()
        rope = {kind: hf.rotary_emb(embeds, position_ids=position_ids, layer_type=kind) for kind in ("main", "compress")}
        for block in self.blocks:
            device = execution_device(block.hf.input_layernorm)  # device_map: a decoder layer runs on one device
            if streams.device != device:
                streams, position_ids = streams.to(device), position_ids.to(device)
                rope = {k: (c.to(device), s.to(device)) for k, (c, s) in rope.items()}
                mask = mask.to(device) if isinstance(mask, Tensor) else mask
                tokens = tokens.to(device)
            with materialized(block.hf):  # offloaded layer: its weights in memory for this layer only
                streams = block(streams, rope, position_ids, mask, tokens)
        streams = streams.to(execution_device(hf.norm))
        final = self.hook_final(hf.norm(hf.hc_head(streams)))
        if return_type is None:
            return None
        logits = self.hf.lm_head(final.to(execution_device(self.hf.lm_head)))
        if return_type == "logits":
            return logits
        return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten().to(logits.device))

    def run_with_cache(self, *model_args: Any, return_cache_object: bool = True, **kwargs: Any):
        """TransformerLens's ``run_with_cache`` (an ``ActivationCache`` unless ``return_cache_object=False``)."""
        out, cache_dict = super().run_with_cache(*model_args, **kwargs)
        if not return_cache_object:
            return out, cache_dict
        from transformer_lens.ActivationCache import ActivationCache

        return out, ActivationCache(cache_dict, self, has_batch_dim=not kwargs.get("remove_batch_dim", False))

    # --------------------------------------------------------------- metadata
    def _check_layer(self, layer: int) -> None:
        n = self.cfg.n_layers
        if isinstance(layer, bool) or not isinstance(layer, int) or not (0 <= layer < n):
            raise UserInputError(f"layer={layer!r} is out of range for a {n}-layer model (0..{n - 1})")

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
        """Source positions of each compressed entry of ``layer`` (HF layout; CSA entry 0 is partial)."""
        comp = self._compressor(layer)
        S = comp.compress_rate
        if comp.two_halves:
            return [list(range(max(0, (j - 1) * S), (j + 1) * S)) for j in range(n_entries)]
        return [list(range(j * S, (j + 1) * S)) for j in range(n_entries)]

    def key_slot_sources(self, layer: int, query_pos: int, n_key_slots: Optional[int] = None, *,
                         seq_len: Optional[int] = None) -> list[tuple[str, list[int]]]:
        """``(kind, source positions)`` of every key slot of ``hook_pattern`` for one query.

        HF layout: slots ``0..T-1`` are the tokens (``"local"`` inside the sliding window
        ``query_pos - sliding_window + 1 .. query_pos``, else ``"masked"``), then one slot per
        compressed entry (``"entry"`` once closed, else ``"masked"``; see `entry_sources`).
        Whether the CSA indexer keeps a closed entry depends on the prompt: read
        ``indexer.hook_selected``. ``T`` comes from ``seq_len``, else from ``n_key_slots``
        (``T + T // S`` slots), else ``query_pos + 1``.
        """
        self._check_layer(layer)
        stride = self.cfg.layer_stride(layer)
        if seq_len is None and n_key_slots is not None:
            per = (lambda t: t) if stride is None else (lambda t: t + t // stride)
            seq_len = next((t for t in range(n_key_slots + 1) if per(t) == n_key_slots), None)
            if seq_len is None:
                raise UserInputError(f"n_key_slots={n_key_slots} matches no sequence length for layer {layer}")
        T = query_pos + 1 if seq_len is None else seq_len
        if not (0 <= query_pos < T):
            raise UserInputError(f"query_pos={query_pos} is out of range 0..{T - 1}")
        lower = query_pos - self.cfg.sliding_window + 1
        out = [("local", [p]) if lower <= p <= query_pos else ("masked", []) for p in range(T)]
        if stride is None:
            return out
        closed = (query_pos + 1) // stride
        for j, sources in enumerate(self.entry_sources(layer, T // stride)):
            out.append(("entry", sources) if j < closed else ("masked", []))
        return out

    def __repr__(self) -> str:
        n_params = sum(p.numel() for p in self.hf.parameters())
        return f"HookedDeepseekV4({self.cfg.label}, layers={self.cfg.n_layers}, params={n_params:,})"

    # ----------------------------------------------------------- checkpoints
    def save_pretrained(self, directory: Union[str, Path], metadata: Optional[dict] = None) -> Path:
        """HF ``save_pretrained`` (safetensors + config.json) plus ``phaseinterp.json`` with ``metadata``."""
        from phaseinterp._files import atomic_write, json_default

        directory = Path(directory)
        self.hf.save_pretrained(directory)
        meta = {**self.metadata, **(metadata or {})}
        atomic_write(directory / SIDECAR_FILE, json.dumps({"metadata": meta}, indent=2, default=json_default).encode())
        return directory
