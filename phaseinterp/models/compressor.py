"""The chunk compressor: one gated cache entry per window (docs/science.md section 2).

For the hidden state ``h`` at slot ``i`` of window ``j`` (position ``jS + i``), per KV head:

    s_{j,i}   = Z_i h + b_i                  gate logit (scalar, or one per channel)
    alpha_j   = softmax_i(s_{j,.})           over the W slots
    K_hat_j   = sum_i alpha_{j,i} * (C_i h)  payload map C_i per slot

separately for keys and values (one shared gate when ``tie_kv_gates``). The DeepSeek-V4
kernel uses one ``kv_proj`` (payload) and one ``gate_proj`` for every slot, plus a
learned per-slot ``position_bias`` (its "ape"); with W = 2S each token has two halves,
the first feeding the window in which it is among the older S tokens and the second the
window in which it is among the newer S tokens (HF ``DeepseekV4CSACompressor``'s
``Ca``/``Cb``). Its entry is RMS-normalised and serves as both key and value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import einops
import torch
import torch.nn as nn
from jaxtyping import Float
from torch import Tensor
from transformer_lens.hook_points import HookPoint

from phaseinterp.config import CompressedConfig
from phaseinterp.errors import UserInputError


@dataclass(frozen=True)
class GateParameters:
    """The offset-specific gate parameters of one compressor branch, per slot.

    ``Z``: ``[slot, kv_head, d_model]`` (scalar gates) or ``[slot, kv_head, d_head, d_model]``
    (vector / DeepSeek gates). ``b``: ``[slot, kv_head]`` or ``[slot, kv_head, d_head]``
    (zeros when the model has no gate bias). For the gated kernel these are the
    parameters themselves (edits write through); for the DeepSeek kernel ``Z`` is the
    ``gate_proj`` half each slot uses and ``b`` is ``position_bias`` laid out per slot
    (copies: edit ``position_bias`` directly). ``None`` for uniform gates.
    """

    Z: Optional[Tensor]
    b: Optional[Tensor]
    kernel: str
    branch: str


def _input_axes(h: Tensor) -> str:
    """einsum axes of the compressor input: one window grid for all KV heads, or one per head."""
    return "b j i k m" if h.ndim == 5 else "b j i m"


def rms_norm(x: Float[Tensor, "... dim"], weight: Float[Tensor, " dim"], eps: float) -> Float[Tensor, "... dim"]:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.w = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.hook_normalized = HookPoint()

    def forward(self, x: Float[Tensor, "... dim"]) -> Float[Tensor, "... dim"]:
        scale = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.hook_normalized(x * scale) * self.w

    def unhooked(self, x: Float[Tensor, "... dim"]) -> Float[Tensor, "... dim"]:
        """The same normalisation without firing the hook (for a second kind of input)."""
        return rms_norm(x, self.w, self.eps)


class Compressor(nn.Module):
    """Turns per-token inputs of closed windows into compressed K and V entries."""

    # The parameters that set the gate logits s = Z h + b (own kernel) or gate_proj h + position_bias
    # (DeepSeek kernel): what makes a gate phase-specific. Pretraining exempts them from weight decay.
    GATE_PARAMETERS = ("Z_k", "Z_v", "b_k", "b_v", "gate_proj", "position_bias")

    def __init__(self, cfg: CompressedConfig):
        super().__init__()
        self.cfg = cfg
        W, S, KV, dh, dm = cfg.window, cfg.stride, cfg.n_kv_heads, cfg.d_head, cfg.d_model
        self.window, self.stride = W, S
        if cfg.compression == "gated":
            branches = ("k",) if cfg.tie_kv_gates else ("k", "v")
            for br in branches:
                if cfg.gate == "scalar":
                    self.register_parameter(f"Z_{br}", nn.Parameter(torch.zeros(W, KV, dm)))
                    if cfg.gate_bias:
                        self.register_parameter(f"b_{br}", nn.Parameter(torch.zeros(W, KV)))
                elif cfg.gate == "vector":
                    self.register_parameter(f"Z_{br}", nn.Parameter(torch.zeros(W, KV, dh, dm)))
                    if cfg.gate_bias:
                        self.register_parameter(f"b_{br}", nn.Parameter(torch.zeros(W, KV, dh)))
            if cfg.payload == "per_slot":
                self.C_k = nn.Parameter(torch.zeros(W, KV, dh, dm))
                self.C_v = nn.Parameter(torch.zeros(W, KV, dh, dm))
        else:  # deepseek
            halves = cfg.n_halves
            self.kv_proj = nn.Parameter(torch.zeros(halves, KV, dh, dm))
            self.gate_proj = nn.Parameter(torch.zeros(halves, KV, dh, dm))
            # position_bias[i, half]: the bias of slot ``half * S + i`` (HF's ape).
            self.position_bias = nn.Parameter(torch.zeros(S, halves, KV, dh))
            self.kv_norm_weight = nn.Parameter(torch.ones(dh))  # HF's kv_norm (RMSNorm) weight
        # One gate feeding K and V (DeepSeek kernel, tied gates): one pair of gate hooks, and an
        # edit moves both; separate K and V gates: a pair per branch (docs/hooks.md).
        self.shared_gate = cfg.compression == "deepseek" or bool(cfg.tie_kv_gates)
        if self.shared_gate:
            self.hook_gate_logits = HookPoint()  # [batch, entry, slot, kv_head(, d_head)]
            self.hook_gate = HookPoint()  # alpha, softmax over slot
        else:
            self.hook_gate_logits_k = HookPoint()
            self.hook_gate_logits_v = HookPoint()
            self.hook_gate_k = HookPoint()
            self.hook_gate_v = HookPoint()
        if cfg.compression == "deepseek":  # one entry serves as K and V (K = V)
            self.hook_kv_compressed = HookPoint()  # [batch, entry, kv_head, d_head] gated sum, before kv_norm
            self.hook_normed_kv_compressed = HookPoint()  # after kv_norm (the value), before RoPE
            self.hook_rot_kv_compressed = HookPoint()  # after kv_norm + RoPE (the key)
        else:
            self.hook_k_compressed = HookPoint()  # [batch, entry, kv_head, d_head] gated sums, before norm/RoPE
            self.hook_v_compressed = HookPoint()
            self.hook_rot_k_compressed = HookPoint()  # the key after (QK-norm and) RoPE

    # ------------------------------------------------------------------ views
    def gate_parameters(self, branch: str = "k") -> GateParameters:
        """The per-slot gate parameters of ``branch`` (``"k"`` or ``"v"``); see `GateParameters`."""
        if branch not in ("k", "v"):
            raise UserInputError(f"branch={branch!r} is not one of ('k', 'v')")
        cfg = self.cfg
        if cfg.compression == "deepseek":
            slot_half = torch.arange(cfg.window, device=self.gate_proj.device) // cfg.stride
            Z = self.gate_proj.detach()[slot_half]
            b = einops.rearrange(self.position_bias.detach(), "s half k d -> (half s) k d")
            return GateParameters(Z=Z, b=b, kernel="deepseek", branch=branch)
        if cfg.gate == "uniform":
            return GateParameters(Z=None, b=None, kernel="gated", branch=branch)
        br = "k" if cfg.tie_kv_gates else branch
        Z = getattr(self, f"Z_{br}")
        b = getattr(self, f"b_{br}", None)
        if b is None:
            b = torch.zeros(Z.shape[:-1], device=Z.device, dtype=Z.dtype)
        return GateParameters(Z=Z, b=b, kernel="gated", branch=branch)

    # ---------------------------------------------------------------- forward
    def gate_hook(self, branch: str, logits: bool = False) -> str:
        """Name (relative to this module) of the alpha (``logits=False``) or gate-logit hook that
        feeds ``branch`` (``"k"``/``"v"``): ``hook_gate[_logits]`` where K and V share one gate."""
        if branch not in ("k", "v"):
            raise UserInputError(f"branch={branch!r} is not one of ('k', 'v')")
        name = "hook_gate_logits" if logits else "hook_gate"
        return name if self.shared_gate else f"{name}_{branch}"

    def _gate_alpha(self, branch: str, h: Float[Tensor, "batch win slot *kv_head d_model"]) -> Tensor:
        """Hooked alpha ``[batch, win, slot, kv_head(, d_head)]`` of the gated kernel's ``branch``."""
        cfg = self.cfg
        batch, n_win, W = h.shape[:3]
        br = "k" if cfg.tie_kv_gates else branch
        hin = _input_axes(h)
        if cfg.gate == "uniform":
            logits = h.new_zeros(batch, n_win, W, cfg.n_kv_heads)
        elif cfg.gate == "scalar":
            logits = einops.einsum(h, getattr(self, f"Z_{br}"), f"{hin}, i k m -> b j i k")
        else:
            logits = einops.einsum(h, getattr(self, f"Z_{br}"), f"{hin}, i k d m -> b j i k d")
        bias = getattr(self, f"b_{br}", None)
        if bias is not None:
            logits = logits + bias
        logits = getattr(self, self.gate_hook(branch, logits=True))(logits)
        return getattr(self, self.gate_hook(branch))(logits.softmax(dim=2))

    def _gated_branch(
        self,
        branch: str,
        h: Float[Tensor, "batch win slot *kv_head d_model"],
        per_token: Float[Tensor, "batch win slot kv_head d_head"],
        alpha: Optional[Tensor] = None,
    ) -> Float[Tensor, "batch win kv_head d_head"]:
        """``sum_i alpha_i * payload_i`` of ``branch``; ``alpha`` given: the shared gate's, else computed."""
        cfg = self.cfg
        hin = _input_axes(h)
        if alpha is None:
            alpha = self._gate_alpha(branch, h)
        if cfg.payload == "per_slot":
            payload = einops.einsum(h, getattr(self, f"C_{branch}"), f"{hin}, i k d m -> b j i k d")
        else:
            payload = per_token
        if alpha.ndim == 4:
            alpha = alpha.unsqueeze(-1)
        return (alpha * payload).sum(dim=2)

    def _deepseek(self, h: Float[Tensor, "batch win slot *kv_head d_model"]) -> Float[Tensor, "batch win kv_head d_head"]:
        cfg = self.cfg
        S = cfg.stride
        slot_half = torch.arange(cfg.window, device=h.device) // S
        kv_w = self.kv_proj[slot_half]  # [slot, kv, d, m]
        gate_w = self.gate_proj[slot_half]
        bias = einops.rearrange(self.position_bias, "s half k d -> (half s) k d")
        hin = _input_axes(h)
        logits = einops.einsum(h, gate_w, f"{hin}, i k d m -> b j i k d") + bias
        kv = einops.einsum(h, kv_w, f"{hin}, i k d m -> b j i k d")
        # One gate and one entry serve K and V: an edit of a gate hook moves both.
        alpha = self.hook_gate(self.hook_gate_logits(logits).softmax(dim=2))
        return self.hook_kv_compressed((alpha * kv).sum(dim=2))

    def forward(
        self,
        h: Float[Tensor, "batch win slot *kv_head d_model"],
        k_tokens: Float[Tensor, "batch win slot kv_head d_head"],
        v_tokens: Float[Tensor, "batch win slot kv_head d_head"],
    ) -> tuple[Float[Tensor, "batch win kv_head d_head"], Float[Tensor, "batch win kv_head d_head"]]:
        """Compressed (K_hat, V_hat) of the windows whose inputs are given.

        ``h`` holds the attention input (after the pre-norm) of each window's tokens (per KV
        head ``[batch, win, slot, kv_head, d_model]`` when the heads' windows are staggered),
        ``k_tokens``/``v_tokens`` their per-token K/V projections (the payload when
        ``payload="shared"``). Returned entries are hooked but not yet normalised/rotated; the
        DeepSeek kernel returns its one K = V entry twice (the same tensor).
        """
        if self.cfg.compression == "deepseek":
            kv_hat = self._deepseek(h)
            return kv_hat, kv_hat
        alpha = self._gate_alpha("k", h) if self.shared_gate else None  # tied: one gate for both
        k_hat = self._gated_branch("k", h, k_tokens, alpha)
        v_hat = self._gated_branch("v", h, v_tokens, alpha)
        return self.hook_k_compressed(k_hat), self.hook_v_compressed(v_hat)

    def reset_parameters(self, generator: torch.Generator, std: float) -> None:
        """Small random gates (near-uniform alpha at init), random payload maps."""
        with torch.no_grad():
            for name, p in self.named_parameters(recurse=False):
                if name.startswith(("Z_", "gate_proj")):
                    p.normal_(0.0, std, generator=generator)
                elif name.startswith(("C_", "kv_proj")):
                    p.normal_(0.0, std, generator=generator)
                elif name.startswith(("b_", "position_bias")):
                    p.zero_()
