"""`HookedDeepseekV4` at one position: recompute the last query of a layer from a clean full forward.

An edit at the final position ``p`` (a knockout of ``hook_z`` there) changes nothing at earlier
positions, so each later layer only needs its output at ``p``. `clean_states` keeps, per layer,
what one clean forward computed at every position (the mHC streams entering the layer, the
attention input, the per-token K = V, the compressed entries, the indexer's entries and scores);
`block_forward_last` then runs one decoder layer for position ``p`` alone:

- mHC collapse / mix and the MoE act per token, on the ``[N, 1, hc_mult, d_model]`` streams;
- keys: the sliding window's tokens ``p - sliding_window + 1 .. p`` (``p`` recomputed), then
  every compressed entry; the entry whose window closes at ``p`` (``(p + 1) % S == 0``) is
  recompressed from the edited token, through the layer's own `compress` maths;
- CSA: the indexer's score row ``p`` is recomputed and HF's top-k runs on it, a row over every
  entry of the prompt (later ones -inf) as in the full forward, so ties break alike (a row's
  top-k does not depend on the other rows of the call; tests/test_dsv4_long.py); HCA: every
  entry closed at ``p`` is visible;
- the attention itself is `attention.attend`, the full forward's, for the one query at ``p``.

A `LayerState` keeps only what position ``p`` reads: the streams at ``p``, the attention input
and K = V of the last ``tail`` positions (the sliding window and the windows of the entry that
closes at ``p``), and every compressed entry. Its memory is O(entries + window) per layer, not
O(T), so a knockout at 128K tokens keeps every layer's state.

Equal to the hooked full forward to 1e-5 (tests/test_deepseek_v4.py, via `ablate`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Sequence

import einops
import torch
from torch import Tensor

from phaseinterp.models.hf.attention import attend
from phaseinterp.models.hf.chunking import TOKEN_BLOCK
from phaseinterp.models.hf.compressor import CompressorHooks, _hf
from phaseinterp.models.hf.config import CSA
from phaseinterp.models.hf.offload import execution_device, materialized
from phaseinterp.errors import UserInputError
from phaseinterp.models.protocol import phase_model
from phaseinterp.models.paths import Z_HOOK, attached_hooks, has_hooks, query_context, record_path


@dataclass(frozen=True)
class LayerState:
    """What one layer's output at the final position ``p = seq_len - 1`` reads from a clean pass over a
    prompt batch (``N`` rows): the tails hold the last ``tail`` positions (``seq_len - tail .. p``)."""

    seq_len: int  # T: the prompt length (p = T - 1)
    resid_pre: Tensor  # [N, 1, hc, d_model] streams entering the layer at p
    attn_in: Tensor  # [N, tail, d_model] collapsed + normed attention input of the last positions
    kv: Tensor  # [N, tail, d_head] per-token K = V after RoPE, last positions
    compressed: Optional[Tensor]  # [N, E, d_head] entries after RoPE (None: sliding-only layer)
    index_compressed: Optional[Tensor]  # [N, E, d_index] (CSA only)

    @property
    def offset(self) -> int:
        """Absolute position of the first kept position (``attn_in[:, 0]``)."""
        return self.seq_len - self.attn_in.shape[1]

    def repeat(self, n: int) -> "LayerState":
        """Each row repeated ``n`` times in place (row ``r`` -> rows ``r*n .. r*n+n-1``)."""
        rep = {k: (v.repeat_interleave(n, 0) if isinstance(v, Tensor) else v) for k, v in self.__dict__.items()}
        return replace(self, **rep)


def tail_length(model, layer: int) -> int:
    """Positions before ``p`` that ``p``'s output in ``layer`` reads: the sliding window and the
    windows of the entry that closes at ``p`` (two for CSA, whose entry spans 2S tokens), plus ``p``."""
    stride = model.cfg.layer_stride(layer)
    window = 0 if stride is None else (2 * stride if model.cfg.layer_types[layer] == CSA else stride)
    return max(model.cfg.sliding_window, window) + 1


def _names(model, layer: int) -> dict[str, str]:
    prefix = f"blocks.{layer}"
    names = {"resid_pre": f"{prefix}.hook_resid_pre", "attn_in": f"{prefix}.ln1.hook_normalized",
             "kv": f"{prefix}.attn.hook_rot_kv"}
    kind = model.cfg.layer_types[layer]
    if model.cfg.layer_stride(layer) is not None:
        names["compressed"] = f"{prefix}.attn.compressor.hook_rot_kv_compressed"
    if kind == CSA:
        names["index_compressed"] = f"{prefix}.attn.compressor.indexer.hook_rot_kv_compressed"
    return names


def _trimmed(key: str, t: Tensor, tail: int) -> Tensor:
    """A hooked per-token activation cut to what `LayerState` keeps (entries are kept whole)."""
    if key == "resid_pre":
        return t[:, -1:].clone()
    if key in ("attn_in", "kv"):
        return t[:, -tail:].clone()
    return t.detach()


@torch.inference_mode()
def clean_states(model, tokens: Tensor) -> tuple[Tensor, list[LayerState]]:
    """One clean pass over ``tokens`` ``[N, T]``: the logits at the last position ``p`` ``[N, vocab]``
    and every layer's `LayerState`. Every layer but the last runs over all positions (its state read
    from its hooks); the last layer's state comes from `layer_state` and its output at ``p`` from
    `block_forward_last`, as in `HookedDeepseekV4.last_logits` (nothing reads its other positions)."""
    *lower, last = range(model.cfg.n_layers)
    per_layer = [_names(model, layer) for layer in lower]
    wanted = {name: (layer, key) for layer, names in enumerate(per_layer) for key, name in names.items()}
    cache: dict[str, Tensor] = {}

    def keep(t: Tensor, hook) -> None:
        layer, key = wanted[hook.name]
        cache[hook.name] = _trimmed(key, t.detach(), tail_length(model, layer))

    with model.hooks(fwd_hooks=[(lambda n: n in wanted, keep)]):
        streams, (tokens, position_ids, rope) = model._through(model.blocks[:-1], *model._decoder_inputs(tokens))
    last_state, logits = last_layer_at_p(model, streams, tokens, position_ids, rope)
    states = []
    N, T = tokens.shape
    for layer, names in enumerate(per_layer):
        got = {k: cache[v] for k, v in names.items() if v in cache}
        # ln1 applies its weight after hook_normalized (float32), then casts back: the attention input
        got["attn_in"] = (model.blocks[layer].ln1.hf.weight * got["attn_in"]).to(got["resid_pre"].dtype)
        comp = model.blocks[layer].attn.compressor
        if "compressed" in names and "compressed" not in got:  # no window closed yet: compress fired no hook
            got["compressed"] = got["kv"].new_zeros((N, 0, 1, model.cfg.d_head))
        if "index_compressed" in names and "index_compressed" not in got:
            got["index_compressed"] = got["kv"].new_zeros((N, 0, comp.indexer.hf.head_dim))
        got["kv"] = got["kv"][:, :, 0]  # one shared KV head
        if "compressed" in got:
            got["compressed"] = got["compressed"][:, :, 0]
        states.append(LayerState(seq_len=T, **{k: got.get(k) for k in LayerState.__dataclass_fields__ if k != "seq_len"}))
    states.append(last_state)
    return logits, states


def layer_state(block, streams: Tensor, rope, position_ids: Tensor, tail: int) -> LayerState:
    """The `LayerState` of ``block`` for its input ``streams`` ``[N, T, hc, d_model]``, without its
    attention queries or its MoE: the same ops as the block's forward up to those (what
    `clean_states` reads from a full forward's hooks), for a layer whose output only ``p`` needs."""
    hf, attn = block.hf, block.attn
    ahf = attn.hf
    mod = _hf()
    N, T = streams.shape[:2]
    d = ahf.head_dim
    collapsed = torch.cat([hf.attn_hc(streams[:, a:a + TOKEN_BLOCK])[2] for a in range(0, T, TOKEN_BLOCK)], dim=1)
    x = block.ln1(collapsed)
    del collapsed
    cos, sin = rope[ahf.rope_layer_type]
    kv = attn.kv_norm(attn.hook_kv(ahf.kv_proj(x).view(N, T, -1, d)))
    kv = attn.hook_rot_kv(mod.apply_rotary_pos_emb(kv.transpose(1, 2), cos, sin).transpose(1, 2))[:, :, 0]
    compressed = index_compressed = None
    comp = attn.compressor
    if isinstance(comp, CompressorHooks):
        compressed = comp.compress(x)  # [N, E, d_head], rotated
        if comp.kind == CSA:
            index_compressed = comp.indexer.compress(x)
    return LayerState(seq_len=T, resid_pre=streams[:, -1:], attn_in=x[:, -tail:], kv=kv[:, -tail:],
                      compressed=compressed, index_compressed=index_compressed)


def last_layer_at_p(model, streams: Tensor, tokens: Tensor, position_ids: Tensor, rope) -> tuple[LayerState, Tensor]:
    """The last layer's `LayerState` for its input ``streams`` ``[N, T, hc, d_model]`` and the model's
    logits at ``p = T - 1`` ``[N, vocab]``, the layer run at ``p`` only (on its execution device,
    offloaded weights brought in as the forward brings them)."""
    block = model.blocks[-1]
    device = execution_device(block.hf.input_layernorm)
    streams, tokens, position_ids = streams.to(device), tokens.to(device), position_ids.to(device)
    rope = {k: (c.to(device), s.to(device)) for k, (c, s) in rope.items()}
    with materialized(block.hf):
        state = layer_state(block, streams, rope, position_ids, tail_length(model, model.cfg.n_layers - 1))
        out = block_forward_last(block, state, state.resid_pre, tokens[:, -1:],
                                 _rope(model, tokens.shape[1] - 1, state.attn_in))
    norm = model.hf.model.norm
    with materialized(norm):
        return state, logits_last(model, out.to(execution_device(norm)))[:, 0]


def _rope(model, position: int, like: Tensor) -> dict[str, tuple[Tensor, Tensor]]:
    position_ids = torch.full((1, 1), position, device=like.device, dtype=torch.long)
    hf = model.hf.model
    return {kind: hf.rotary_emb(like, position_ids=position_ids, layer_type=kind) for kind in ("main", "compress")}


def _window_tokens(state: LayerState, x_last: Tensor, first: int) -> Tensor:
    """Attention inputs of positions ``first .. p`` with position ``p`` replaced by ``x_last``."""
    if first < state.offset:
        raise RuntimeError(f"position {first} lies before the kept tail (from {state.offset})")
    return torch.cat([state.attn_in[:, first - state.offset:-1], x_last], dim=1)


def _recompressed(comp, state_entries: Tensor, state: LayerState, x_last: Tensor) -> Tensor:
    """``state_entries`` with the entry whose window closes at ``p`` recompressed from the edited token."""
    T = state.seq_len
    S = comp.compress_rate
    E = state_entries.shape[1]
    if T % S or E == 0:
        return state_entries  # position p lies in a window not closed yet: no entry holds it
    j = E - 1  # its window ends at p
    first_window = max(0, j - 1) if comp.two_halves else j  # CSA: the older half comes from window j-1
    entries = comp.compress(_window_tokens(state, x_last, first_window * S), first_window=first_window)
    return torch.cat([state_entries[:, :j], entries[:, -1:]], dim=1)


def _chosen_entries(attn, state: LayerState, x_last: Tensor, q_residual: Tensor) -> Tensor:
    """The indexer's top-k at ``p`` ``[N, 1, k]`` (-1: none), as `IndexerHooks.select` chooses them: the
    score row ``p`` over every entry of the prompt (later ones -inf), HF's top-k on it."""
    comp = attn.compressor
    indexer = comp.indexer
    ihf = indexer.hf
    mod = _hf()
    N = x_last.shape[0]
    T = state.seq_len
    closed = T // comp.compress_rate  # entries j < closed have closed windows at p = T - 1
    index_entries = _recompressed(indexer, state.index_compressed, state, x_last)
    E = index_entries.shape[1]
    position_ids = torch.full((1, 1), T - 1, device=x_last.device, dtype=torch.long)
    cos, sin = ihf.rotary_emb(x_last, position_ids=position_ids, layer_type=ihf.rope_layer_type)
    q = ihf.q_b_proj(q_residual).view(N, 1, -1, ihf.head_dim).transpose(1, 2)
    q = mod.apply_rotary_pos_emb(q, cos, sin).transpose(1, 2)
    row = ihf.scorer(q, index_entries, x_last)  # [N, 1, E]
    entry = torch.arange(E, device=row.device)
    row = row.masked_fill(entry.view(1, 1, -1) >= closed, float("-inf"))
    top = row.topk(min(ihf.index_topk, E), dim=-1).indices  # the full forward's row (every entry)
    return torch.where(top >= closed, torch.full_like(top, -1), top)


def _attention_last(attn, state: LayerState, x_last: Tensor, rope) -> Tensor:
    """HF ``DeepseekV4Attention`` for the query at ``p`` only, through `attention.attend` (the full
    forward's attention, one query): ``[N, 1, d_model]``."""
    hf = attn.hf
    mod = _hf()
    N = x_last.shape[0]
    T = state.seq_len
    d = hf.head_dim
    cos, sin = rope[hf.rope_layer_type]
    q_residual = hf.q_a_norm(hf.q_a_proj(x_last))
    q = hf.q_b_norm(hf.q_b_proj(q_residual).view(N, 1, -1, d))
    q = mod.apply_rotary_pos_emb(q.transpose(1, 2), cos, sin)  # [N, head, 1, d]
    kv = hf.kv_norm(hf.kv_proj(x_last)).view(N, 1, -1, d)
    kv = mod.apply_rotary_pos_emb(kv.transpose(1, 2), cos, sin).transpose(1, 2)[:, :, 0]  # [N, 1, d]
    keys = torch.cat([state.kv[:, :-1], kv], dim=1)  # positions state.offset .. p, p recomputed
    entries = stride = chosen = None
    comp = attn.compressor
    if isinstance(comp, CompressorHooks):
        stride = comp.compress_rate
        entries = _recompressed(comp, state.compressed, state, x_last)
        if comp.kind == CSA:
            chosen = _chosen_entries(attn, state, x_last, q_residual)
    hooked = has_hooks(attn.hook_attn_scores) or has_hooks(attn.hook_pattern)
    z = attend(hf, q, (T - 1, T), keys, state.offset, entries, stride, chosen, cos, sin, every_entry=hooked,
               hooks=(attn.hook_attn_scores, attn.hook_pattern))  # [N, 1, head, d]
    if has_hooks(attn.hook_z):  # position p only: [N, 1, head, d_head]
        with query_context([attn.hook_z], T - 1, T):
            z = attn.hook_z(z)
    grouped = hf.o_a_proj(einops.rearrange(z, "n 1 (g h) d -> n 1 g (h d)", g=hf.config.o_groups)).flatten(2)
    return hf.o_b_proj(grouped)


def block_forward_last(block, state: LayerState, streams: Tensor, token: Tensor, rope) -> Tensor:
    """One decoder layer at ``p`` for ``streams`` ``[N, 1, hc, d_model]`` (the layer's input there);
    ``token`` ``[N, 1]`` the token at ``p`` (hash routing). ``attn.hook_z`` fires with ``[N, 1, head,
    d_head]`` (``hook.ctx["query_range"] == (p, p + 1)``); no other hook point does. Returns the
    layer's output streams at ``p``."""
    hf = block.hf
    dtype = streams.dtype
    post, comb, collapsed = hf.attn_hc(streams)
    attn_out = _attention_last(block.attn, state, hf.input_layernorm(collapsed), rope)
    streams = post.to(dtype).unsqueeze(-1) * attn_out.unsqueeze(-2) + torch.matmul(
        comb.to(dtype).transpose(-1, -2), streams)
    post, comb, collapsed = hf.ffn_hc(streams)
    mlp_out = hf.mlp(hf.post_attention_layernorm(collapsed), input_ids=token)
    return post.to(dtype).unsqueeze(-1) * mlp_out.unsqueeze(-2) + torch.matmul(comb.to(dtype).transpose(-1, -2), streams)


def logits_last(model, streams: Tensor) -> Tensor:
    """Final mHC head, norm and unembedding of the streams at ``p``: ``[N, 1, vocab]``."""
    hf = model.hf.model
    return model.hf.lm_head(hf.norm(hf.hc_head(streams)))


__all__ = ["LayerState", "block_forward_last", "clean_states", "last_layer_at_p", "layer_state",
           "logits_last"]


# ------------------------------------------------------------------ the knockout engine
def require_unhooked(model, what: str = "the last-position engine") -> None:
    """Raise naming the attached hooks: the engine computes the unhooked model only."""
    names = attached_hooks(model)
    if names:
        raise UserInputError(f"{what} cannot run hooks at every position; hooks are attached at {', '.join(names)} "
                             "(experiments take the hooked full forward instead)")


class DeepseekV4Engine:
    """DeepSeek-V4's last-position engine over ``tokens`` ``[n, p + 1]`` (module docstring): one
    clean pass keeps each layer's `LayerState`, then ``variants`` runs `block_forward_last` per layer
    for the final position, ``V`` copies of each prompt, firing only the ``hook_z`` hooks it is given
    (``[n * V, 1, head, d_head]``, row ``r``: prompt ``r // V``, variant ``r % V``;
    ``hook.ctx["query_range"] == (p, p + 1)``). ``clean`` is ``[n, vocab]``, the logits at ``p``."""

    def __init__(self, model, tokens: Tensor):
        require_unhooked(model)
        self.model, self.tokens = model, tokens
        self.clean, self.states = clean_states(model, tokens)
        record_path(model, "last_position")
        self.rope = _rope(model, tokens.shape[1] - 1, self.states[0].attn_in)

    def variants(self, layer: int, n_variants: int, fwd_hooks: Sequence[tuple]) -> Tensor:
        """``[n, V, vocab]``: the final position from ``layer`` on, ``V = n_variants`` copies of each
        prompt, the ``hook_z`` hooks ``fwd_hooks`` attached (they tell the variants apart)."""
        for name, _ in fwd_hooks:
            if not (isinstance(name, str) and Z_HOOK.fullmatch(name) and int(name.split(".")[1]) >= layer):
                raise UserInputError(f"the last-position engine runs hook_z hooks of layers >= {layer} only; "
                                     f"got {name!r}")
        model, V = self.model, n_variants
        n = self.tokens.shape[0]
        token = self.tokens[:, -1:].repeat_interleave(V, 0)  # row r: prompt r // V, variant r % V
        streams = self.states[layer].resid_pre.repeat_interleave(V, 0)
        with model.hooks(fwd_hooks=list(fwd_hooks)):  # hook_z fires inside block_forward_last
            for later in range(layer, model.cfg.n_layers):
                state = self.states[later] if V == 1 else self.states[later].repeat(V)
                streams = block_forward_last(model.blocks[later], state, streams, token, self.rope)
        record_path(model, "last_position")
        return logits_last(model, streams)[:, 0].reshape(n, V, -1)


def last_position_engine(model, tokens: Tensor) -> DeepseekV4Engine:
    """DeepSeek-V4's engine over ``tokens`` (cut after the answer position); refuses while a hook is
    attached or where the model has none (offloaded layers)."""
    if not phase_model(model).has_fast_ablation:
        raise UserInputError(f"{type(model).__name__} has no last-position engine here (PhaseModel.has_fast_ablation "
                             "is False: offloaded layers)")
    return DeepseekV4Engine(model, tokens)

