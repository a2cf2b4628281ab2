"""The specification of compressed attention: one query at a time, explicit key lists.

This file is the readable statement of what `phaseinterp.models.attention` computes, written
straight from docs/science.md section 2 ("Compressor", "Attention"). It shares no code with the
vectorized model beyond reading its parameters; every evaluation of the one forward (docs/models.md,
"One forward") equals it to 1e-5. It is slow (Python loops): use it to read or to check.

For one sequence ``x`` ``[pos, d_model]`` (the attention input, after the pre-norm) and query
``t``, per query head (reading KV head ``head // (n_heads / n_kv_heads)``):

    keys    = band(t)  (exact tokens, rotated at their own position)
            + [entry(j) for every window j closed by t: j*S + o + W - 1 <= t]
              (rotated at j*S + o + W - S)
    z_t     = softmax_keys(q_t . k / sqrt(d_head)) @ values
    out_t   = sum_heads z_t[head] @ W_O[head]

``band(t)`` is the last ``L = local_window`` tokens (``memory="local"``) or the tokens after the
last closed window (``memory="uncompressed_tail"``). ``entry(j)`` is `compressed_entry`.
"""

from __future__ import annotations

import math

import torch


def rms(x, w, eps):
    """RMS normalisation ``x / sqrt(mean(x^2) + eps) * w`` (QK-norm, DeepSeek's kv_norm)."""
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def rope(x, pos, dims, base):
    """Rotate-half RoPE of one vector ``x`` [d] at integer position ``pos`` on its first ``dims`` dims:
    pair ``(x[i], x[dims/2 + i])`` turns by ``pos * base^(-2i/dims)``."""
    if dims == 0:
        return x
    out = x.clone()
    half = dims // 2
    for i in range(half):
        theta = pos * base ** (-(2 * i) / dims)
        c, s = math.cos(theta), math.sin(theta)
        a, b = x[i], x[half + i]
        out[i] = a * c - b * s
        out[half + i] = b * c + a * s
    return out


def compressed_entry(attn, h, k_tok, v_tok, j, head, offset=0):
    """Compressed (key, value) of window j (positions ``j*S + offset .. j*S + offset + W - 1``) for
    KV head ``head``, before normalisation and RoPE (docs/science.md, "Compressor").

    ``h`` ``[pos, d_model]``: the attention input; ``k_tok``/``v_tok`` ``[pos, kv_head, d_head]``:
    the per-token projections (the payload when ``payload="shared"``). Gated kernel, per branch:
    ``s_i = Z_i h_i + b_i``, ``alpha = softmax_i(s)``, ``entry = sum_i alpha_i * payload_i``.
    DeepSeek kernel (one entry is both key and value): slot ``i`` uses the projections of half
    ``i // S``: ``s_i = gate_proj[half] h_i + position_bias[i mod S, half]``,
    ``entry = rms(sum_i alpha_i * kv_proj[half] h_i, kv_norm)`` (normalised here already)."""
    cfg = attn.cfg
    comp = attn.compressor
    W, S = cfg.window, cfg.stride
    slots = [j * S + offset + i for i in range(W)]
    if cfg.compression == "deepseek":
        logits, payloads = [], []
        for i, p in enumerate(slots):
            half = i // S
            logits.append(comp.gate_proj[half, head] @ h[p] + comp.position_bias[i % S, half, head])
            payloads.append(comp.kv_proj[half, head] @ h[p])
        alpha = torch.softmax(torch.stack(logits), dim=0)  # [slot, d]
        kv = (alpha * torch.stack(payloads)).sum(0)
        kv = rms(kv, comp.kv_norm_weight, cfg.norm_eps)
        return kv, kv
    out = []
    for branch, tok in (("k", k_tok), ("v", v_tok)):
        gb = "k" if cfg.tie_kv_gates else branch
        logits = []
        for i, p in enumerate(slots):
            if cfg.gate == "uniform":
                s = torch.zeros(())
            else:  # scalar: Z_i [d_model] -> one logit; vector: Z_i [d_head, d_model] -> one per channel
                s = getattr(comp, f"Z_{gb}")[i, head] @ h[p]
            if cfg.gate != "uniform" and cfg.gate_bias:
                s = s + getattr(comp, f"b_{gb}")[i, head]
            logits.append(s)
        alpha = torch.softmax(torch.stack(logits), dim=0)
        entry = 0
        for i, p in enumerate(slots):
            payload = getattr(comp, f"C_{branch}")[i, head] @ h[p] if cfg.payload == "per_slot" else tok[p, head]
            entry = entry + alpha[i] * payload
        out.append(entry)
    return out[0], out[1]


@torch.no_grad()
def reference_attention(attn, x):
    """The attention output ``[pos, d_model]`` of layer ``attn`` (a `CompressedAttention`) for one
    sequence ``x`` ``[pos, d_model]`` (the attention input), one query at a time."""
    cfg = attn.cfg
    T = x.shape[0]
    W, S, L = cfg.window, cfg.stride, cfg.local_window
    g = cfg.n_heads // cfg.n_kv_heads
    dims = cfg.rotary_dims
    q_w, k_w, v_w, o_w = attn.W_Q, attn.W_K, attn.W_V, attn.W_O
    out = torch.zeros(T, cfg.d_model)
    k_tok = torch.stack([torch.stack([x[p] @ k_w[kv] for kv in range(cfg.n_kv_heads)]) for p in range(T)])
    v_tok = torch.stack([torch.stack([x[p] @ v_w[kv] for kv in range(cfg.n_kv_heads)]) for p in range(T)])
    for t in range(T):
        z_heads = []
        for head in range(cfg.n_heads):
            kv = head // g
            q = x[t] @ q_w[head]
            if cfg.qk_norm:
                q = rms(q, attn.q_norm.w, cfg.norm_eps)
            q = rope(q, t, dims, cfg.rope_base)
            keys, values = [], []

            def exact(p, kv=kv, keys=keys, values=values):
                k = k_tok[p, kv]
                if cfg.qk_norm:
                    k = rms(k, attn.k_norm.w, cfg.norm_eps)
                keys.append(rope(k, p, dims, cfg.rope_base))
                values.append(v_tok[p, kv])

            if not cfg.is_compressed:
                for p in range(t + 1):
                    exact(p)
            else:
                o = cfg.layer_window_offsets(attn.layer)[kv]  # this KV head's grid: windows at j*S + o
                closed = [j for j in range(T) if j * S + o + W - 1 <= t]
                if cfg.memory == "local":
                    local = [p for p in range(t - L + 1, t + 1) if p >= 0]
                else:
                    covered = set(p for j in closed for p in range(j * S + o, j * S + o + W))
                    start = max(covered) + 1 if covered else 0
                    local = list(range(start, t + 1))
                for p in local:
                    exact(p)
                for j in closed:
                    k, v = compressed_entry(attn, x, k_tok, v_tok, j, kv, o)
                    if cfg.compression != "deepseek" and cfg.qk_norm:
                        k = rms(k, attn.k_norm.w, cfg.norm_eps)
                    keys.append(rope(k, j * S + o + W - S, dims, cfg.rope_base))
                    values.append(v)
            scores = torch.stack([q @ k for k in keys]) / math.sqrt(cfg.d_head)
            p_attn = torch.softmax(scores, dim=0)
            z_heads.append(sum(p_attn[i] * values[i] for i in range(len(values))))
        for head in range(cfg.n_heads):
            out[t] += z_heads[head] @ o_w[head]
    return out


__all__ = ["compressed_entry", "reference_attention", "rms", "rope"]
