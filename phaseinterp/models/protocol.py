"""The model protocol: what every model family provides to the experiments (docs/models.md).

Experiments ask ``phase_model(model)`` instead of probing the model object (``hasattr``,
``cfg.compression == ...``): it returns a `PhaseModel` adapter for phaseinterp's own
`CompressedTransformer` (`CompressedFamily`) or a wrapped Hugging Face DeepSeek-V4
(`DeepseekV4Family`), and `GenericModel` for any other ``nn.Module`` with a ``cfg`` that the
phase profile can still evaluate (the mechanistic experiments refuse it, saying why).

Per layer a family states its stride and window (None where the layer is uncompressed: a
sliding-window-only DeepSeek-V4 layer, the full-attention twin), its KV heads and the query
heads that read each, the boundary phases, the key-slot sources of ``hook_pattern``, where a
KV head's mean replacement happens (`KnockoutPoint`), which parameters a gate shift rolls
(`GateTarget`) and whether the cached-prefix fast ablation path exists.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, NamedTuple, Optional, Protocol, runtime_checkable
from pathlib import Path

import torch

from phaseinterp._checks import check_is_model, check_layer
from phaseinterp.errors import UserInputError
from phaseinterp.phase import boundary_phase

CSA = "compressed_sparse_attention"  # DeepSeek-V4's layer type with an indexer (= models.hf.config.CSA; importing
# that package here would load the family, which itself registers with this module)


class KnockoutPoint(NamedTuple):
    """Where KV head ``kv_head`` of ``layer`` is mean-replaced: the per-query-head attention output
    ``hook`` (``[batch, pos, head, d_head]``) of the ``query_heads`` that read it."""

    hook: str
    query_heads: tuple[int, ...]


class GateTarget(NamedTuple):
    """One gate parameter a cyclic shift rolls: ``parameter`` (edits write into the model), its
    ``slot_axis``, its KV-head axis (None: one shared KV head), the gate-logit ``hook`` whose
    per-slot mean the static-part shift moves, and ``layout``, how that hook's ``[slot, kv_head(,
    d_head)]`` maps onto the parameter: ``"slot"`` (gated kernel), ``"own_deepseek"``
    (``position_bias`` ``[S, half, kv_head, d_head]``) or ``"hf"`` (``[S, half * d_head]``)."""

    parameter: torch.nn.Parameter
    slot_axis: int
    kv_axis: Optional[int]
    hook: str
    layout: str


@runtime_checkable
class PhaseModel(Protocol):
    """What an experiment may ask of a model, whatever its family."""

    model: Any
    family: str

    @property
    def n_layers(self) -> int: ...

    @property
    def stride(self) -> int:
        """The phase-defining stride S (phases are ``t mod S``)."""

    @property
    def is_compressed(self) -> bool: ...

    @property
    def label(self) -> str: ...

    @property
    def compressed_layers(self) -> list[int]: ...

    def layer_stride(self, layer: int) -> Optional[int]:
        """Positions between window starts of ``layer``; None where the layer is uncompressed."""

    def layer_window(self, layer: int) -> Optional[int]:
        """Slots per compressed entry of ``layer`` (W); None where the layer is uncompressed."""

    def kv_heads(self, layer: int) -> dict[int, list[int]]:
        """KV head -> the query heads that read it."""

    def window_offsets(self, layer: int) -> tuple[int, ...]:
        """Per KV head, where its window grid starts (windows at ``j*S + o``)."""

    def boundary_phases(self, layer: int) -> tuple[int, ...]:
        """Per KV head, the phase ``t mod S`` of the positions that close its windows (empty for an
        uncompressed layer)."""

    def key_slot_sources(self, layer: int, query_pos: int, n_key_slots: Optional[int] = None) -> list:
        """``(kind, source positions)`` of each key slot of ``hook_pattern`` / ``hook_attn_scores`` for
        one query, in the one key layout of both families (docs/hooks.md): slots ``0..B-1`` the band
        of exact tokens, oldest first (slot ``s`` holds token ``query_pos - B + 1 + s``; kind
        ``"local"``, or ``"masked"`` outside the band), then slot ``B + j`` compressed entry ``j``
        (``"entry"`` with the positions it reads, ``jS + g .. jS + g + W - 1``, once closed, else
        ``"masked"``). ``B``: ``local_window`` / the tail width (own family), ``sliding_window``
        (DeepSeek-V4). An uncompressed full-attention model has one slot per position (``"token"``)."""

    def gate_hook(self, layer: int, branch: str, logits: bool = False) -> str:
        """The alpha / gate-logit hook name feeding ``branch`` of ``layer`` (one for K and V where they
        share a gate)."""

    @property
    def indexer_layers(self) -> list[int]:
        """Layers whose compressed entries an indexer selects per query (DeepSeek-V4's CSA top-k)."""

    def knockout_point(self, layer: int, kv_head: int) -> KnockoutPoint: ...

    def gate_targets(self, layer: int, branch: str = "both") -> list[GateTarget]:
        """The parameters a gate shift of ``layer`` rolls (ValueError where a shift has no meaning)."""

    @property
    def has_fast_ablation(self) -> bool:
        """Whether `ablate` runs its sweep through the cached forward (one prefill of the shared prefix,
        then the answer position in variants: both families); else the hooked full forward per unit."""

    def layer_inputs(self, tokens) -> dict:
        """The keywords a ``start_at_layer`` call over the positions of ``tokens`` takes besides the
        residual: DeepSeek-V4's hash-routed MoE layers read the token ids (``{"input_ids": tokens}``);
        the own family needs none (``{}``)."""

    @property
    def has_answer_logits(self) -> bool:
        """Whether `answer_logits` skips the last layer's work at every position but the last (a
        ``last_logits`` path); else it is the full forward's last row."""

    def answer_logits(self, tokens) -> torch.Tensor:
        """``[batch, d_vocab]`` logits at the LAST position of ``tokens`` (cut the prompts after the
        answer position first): what `phase_profile` and gate cycling read, one answer per prompt."""

    def z_hook(self, layer: int) -> str:
        """The per-query-head attention output hook of ``layer`` (``[batch, pos, head, d_head]``)."""

    def resid_pre_hook(self, layer: int) -> str:
        """The hook of the residual stream entering ``layer`` (what ``start_at_layer`` takes)."""

    def indexer_hook(self, layer: int, name: str) -> str:
        """An indexer hook (``"hook_scores"`` or ``"hook_selected"``) of a layer in `indexer_layers`."""

    def cycling_fitness(self) -> tuple[bool, str]:
        """Whether gate cycling is a meaningful experiment on this model, and why (one sentence)."""


class _Family:
    """Shared by every family: the layer check and the knockout point (``hook_z`` of the query heads)."""

    family = "generic"

    def __init__(self, model):
        self.model = model

    @property
    def cfg(self):
        return self.model.cfg

    @property
    def n_layers(self) -> int:
        return int(self.cfg.n_layers)

    @property
    def stride(self) -> int:
        return int(self.cfg.stride)

    @property
    def is_compressed(self) -> bool:
        return bool(self.cfg.is_compressed)

    @property
    def label(self) -> str:
        """The model's name in results, reprs and the report: its zoo name or checkpoint folder
        first, then its architecture (``"w4s4-1kv-shared (W4/S4 gated)"``), so two zoo models of one
        architecture never print the same label; the architecture alone for an unnamed model."""
        return model_label(self.model)

    @property
    def compressed_layers(self) -> list[int]:
        return [layer for layer in range(self.n_layers) if self.layer_stride(layer) is not None]

    @property
    def indexer_layers(self) -> list[int]:
        return []

    def _check_layer(self, layer: int) -> None:
        check_layer(layer, self.n_layers)

    def kv_heads(self, layer: int) -> dict[int, list[int]]:
        self._check_layer(layer)
        return self.cfg.kv_head_groups()

    def window_offsets(self, layer: int) -> tuple[int, ...]:
        self._check_layer(layer)
        return tuple(self.cfg.layer_window_offsets(layer))

    def boundary_phases(self, layer: int) -> tuple[int, ...]:
        rate = self.layer_stride(layer)
        if rate is None:
            return ()
        # a window of `rate` positions closes at t = o + k*rate - 1; its phase on the shared stride S
        return tuple(boundary_phase(rate, o) % self.stride for o in self.window_offsets(layer))

    def gate_hook(self, layer: int, branch: str, logits: bool = False) -> str:
        """The alpha (``logits=False``) or gate-logit hook feeding ``branch`` (``"k"``/``"v"``) of
        ``layer``: ``...compressor.hook_gate[_logits]`` where K and V share one gate (DeepSeek kernels,
        tied gates; an edit moves both), else ``hook_gate[_logits]_{branch}`` (docs/hooks.md)."""
        if self.layer_stride(layer) is None:
            raise UserInputError(f"layer {layer} has no compressor (no gates); compressed layers: "
                                 f"{self.compressed_layers}")
        comp = self.model.blocks[layer].attn.compressor
        return f"blocks.{layer}.attn.compressor.{comp.gate_hook(branch, logits)}"

    def _check_gate_shift(self, layer: int, branch: str, one_gate: bool) -> None:
        """Refuse a gate shift of an uncompressed model, an unknown ``branch``, a bad ``layer``, and (a
        kernel with ``one_gate`` for K and V) a branch other than ``"both"``."""
        if not self.cfg.is_compressed:
            raise UserInputError("shift_gates: the full-attention model (compression=None) has no gates to shift")
        if branch not in ("both", "k", "v"):
            raise UserInputError(f"branch={branch!r} is not one of ('both', 'k', 'v')")
        self._check_layer(layer)
        if one_gate and branch != "both":
            raise UserInputError("shift_gates: the deepseek kernel has one gate for K and V; use branch='both'")

    def knockout_point(self, layer: int, kv_head: int) -> KnockoutPoint:
        groups = self.kv_heads(layer)
        if kv_head not in groups:
            raise UserInputError(f"kv_head={kv_head!r} is out of range for layer {layer} "
                                 f"(KV heads 0..{len(groups) - 1})")
        return KnockoutPoint(self.z_hook(layer), tuple(int(h) for h in groups[kv_head]))

    @property
    def has_fast_ablation(self) -> bool:
        return False

    def layer_inputs(self, tokens) -> dict:
        return {}

    @property
    def has_answer_logits(self) -> bool:
        return True  # both families have ``last_logits``: a prefill, then one step

    def answer_logits(self, tokens) -> torch.Tensor:
        return self.model.last_logits(tokens)

    def z_hook(self, layer: int) -> str:
        self._check_layer(layer)
        return f"blocks.{layer}.attn.hook_z"

    def resid_pre_hook(self, layer: int) -> str:
        self._check_layer(layer)
        return f"blocks.{layer}.hook_resid_pre"

    def indexer_hook(self, layer: int, name: str) -> str:
        if name not in ("hook_scores", "hook_selected"):
            raise UserInputError(f"name={name!r} is not one of ('hook_scores', 'hook_selected')")
        self._check_layer(layer)
        if layer not in self.indexer_layers:
            raise UserInputError(f"layer {layer} has no indexer (layers with one: {self.indexer_layers})")
        return f"blocks.{layer}.attn.compressor.indexer.{name}"


class CompressedFamily(_Family):
    """phaseinterp's own `CompressedTransformer` (every layer compressed alike, or none)."""

    family = "compressed"

    def cycling_fitness(self) -> tuple[bool, str]:
        """Gate cycling needs offset-specific gate parameters (W = S gated with scalar or vector
        gates, or the DeepSeek kernel's ``position_bias``) AND payloads shared across slots: with a
        payload map ``C_i`` per slot, a shifted gate weights maps never trained for that slot, so
        every phase collapses and the scores measure that collapse, not the weak spots moving
        (docs/science.md, "Gate cycling"). Such a run is a negative control, to be labelled as one."""
        cfg = self.cfg
        if not cfg.is_compressed:
            return False, "full attention has no gates to shift"
        if cfg.compression == "deepseek":
            return True, "DeepSeek kernel: one kv_proj shared by every slot, gate preferences in position_bias"
        if cfg.window != cfg.stride:
            return False, f"W={cfg.window} != S={cfg.stride}: with overlapping gated windows a slot is not a phase"
        if cfg.gate == "uniform":
            return False, "uniform gates have no offset-specific parameters"
        if getattr(cfg, "payload", "per_slot") != "shared":
            return False, ("payload map per slot: a shifted gate reads maps never trained for its slot, so every "
                           "phase collapses; a run there is a negative control, not a test of the prediction")
        return True, "W = S gates with one payload map shared by every slot (as DeepSeek's kv_proj)"

    def layer_stride(self, layer: int) -> Optional[int]:
        self._check_layer(layer)
        return int(self.cfg.stride) if self.cfg.is_compressed else None

    def layer_window(self, layer: int) -> Optional[int]:
        self._check_layer(layer)
        return int(self.cfg.window) if self.cfg.is_compressed else None

    def key_slot_sources(self, layer: int, query_pos: int, n_key_slots: Optional[int] = None, kv_head: int = 0):
        return self.model.key_slot_sources(layer, query_pos, n_key_slots, kv_head)

    def gate_targets(self, layer: int, branch: str = "both") -> list[GateTarget]:
        cfg = self.cfg
        self._check_gate_shift(layer, branch, one_gate=cfg.compression == "deepseek")
        comp = self.model.blocks[layer].attn.compressor
        prefix = f"blocks.{layer}.attn.compressor"
        if cfg.compression == "deepseek":  # position_bias [S, half, kv_head, d_head]
            return [GateTarget(comp.position_bias, 0, 2, f"{prefix}.hook_gate_logits", "own_deepseek")]
        if cfg.window != cfg.stride:
            raise UserInputError(
                f"shift_gates is defined for W = S (got window={cfg.window}, stride={cfg.stride}): "
                "with overlapping gated windows a slot is not a phase"
            )
        if cfg.gate == "uniform":
            raise UserInputError("shift_gates: gate='uniform' has no offset-specific gate parameters to shift")
        if cfg.tie_kv_gates and branch != "both":
            raise UserInputError(f"shift_gates: K and V gates are tied; branch={branch!r} cannot shift one alone")
        branches = ("k",) if cfg.tie_kv_gates else (("k", "v") if branch == "both" else (branch,))
        targets = []
        for br in branches:
            hook = f"{prefix}.{comp.gate_hook(br, logits=True)}"  # tied: the one hook_gate_logits
            targets.append(GateTarget(getattr(comp, f"Z_{br}"), 0, 1, hook, "slot_weight"))
            bias = getattr(comp, f"b_{br}", None)  # None: gate_bias=False
            if bias is not None:
                targets.append(GateTarget(bias, 0, 1, hook, "slot"))
        return targets

    @property
    def has_fast_ablation(self) -> bool:
        return True  # the cached forward: prefill, then a step over a fork of the cache


class DeepseekV4Family(_Family):
    """A wrapped Hugging Face DeepSeek-V4 (`HookedDeepseekV4`): CSA / HCA / sliding-only layers,
    one shared KV head (K = V) per layer, windows on one grid starting at position 0."""

    def cycling_fitness(self) -> tuple[bool, str]:
        if not self.compressed_layers:
            return False, "no compressed layer: no gates to shift"
        return True, "DeepSeek kernel: one kv_proj shared by every slot, gate preferences in position_bias"

    family = "deepseek_v4"

    def layer_stride(self, layer: int) -> Optional[int]:
        self._check_layer(layer)
        return self.cfg.layer_stride(layer)

    def layer_window(self, layer: int) -> Optional[int]:
        self._check_layer(layer)
        return self.cfg.layer_window(layer)

    @property
    def indexer_layers(self) -> list[int]:
        return [layer for layer, kind in enumerate(self.cfg.layer_types) if kind == CSA]

    def key_slot_sources(self, layer: int, query_pos: int, n_key_slots: Optional[int] = None, kv_head: int = 0):
        if kv_head != 0:
            raise UserInputError(f"kv_head={kv_head!r}: DeepSeek-V4 layers have one shared KV head (0)")
        return self.model.key_slot_sources(layer, query_pos, n_key_slots)

    def gate_targets(self, layer: int, branch: str = "both") -> list[GateTarget]:
        self._check_gate_shift(layer, branch, one_gate=True)
        if self.layer_stride(layer) is None:
            raise UserInputError(f"shift_gates: layer {layer} is a sliding-window-only layer (no compressor); "
                                 f"compressed layers: {self.compressed_layers}")
        bias = self.model.position_bias(layer)  # [S, half * d_head] (HCA: [R, d_head]), one KV head
        return [GateTarget(bias, 0, None, f"blocks.{layer}.attn.compressor.hook_gate_logits", "hf")]

    @property
    def has_fast_ablation(self) -> bool:
        return True  # the cached forward (offloaded layers are brought in per layer, as in any forward)

    def layer_inputs(self, tokens) -> dict:
        return {"input_ids": tokens}


class GenericModel(_Family):
    """Any other ``nn.Module`` mapping tokens to logits with a ``cfg`` (``stride``, optionally
    ``d_vocab``, ``n_ctx``, ``label``, ``is_compressed``): enough for `phase_profile`; the
    mechanistic experiments need a family above."""

    family = "generic"

    @property
    def stride(self) -> Optional[int]:
        return getattr(self.cfg, "stride", None)

    @property
    def is_compressed(self) -> bool:
        return bool(getattr(self.cfg, "is_compressed", False))

    @property
    def label(self) -> str:
        return str(getattr(self.cfg, "label", type(self.model).__name__))

    @property
    def n_layers(self) -> int:
        return int(getattr(self.cfg, "n_layers", 0))

    @property
    def cfg(self):
        return getattr(self.model, "cfg", None)

    def _unsupported(self, *args, **kwargs):
        raise UserInputError(f"{type(self.model).__name__} is not a phaseinterp model family (CompressedTransformer "
                             "or a wrapped DeepSeek-V4, phaseinterp.from_hf): only phase_profile runs on it")

    layer_stride = layer_window = key_slot_sources = gate_targets = kv_heads = window_offsets = gate_hook = _unsupported
    z_hook = indexer_hook = _unsupported

    @property
    def has_answer_logits(self) -> bool:
        return False

    def answer_logits(self, tokens) -> torch.Tensor:
        return self.model(tokens)[:, -1]

    def cycling_fitness(self) -> tuple[bool, str]:
        return False, f"{type(self.model).__name__} is not a phaseinterp model family: no gates to shift"


def model_name(model) -> Optional[str]:
    """The folder a Hugging Face checkpoint was loaded from (``metadata["checkpoint"]["path"]``: an
    exported copy is named by its folder), else the zoo name (``metadata["zoo_name"]``), else None."""
    metadata = getattr(model, "metadata", None) or {}
    checkpoint = metadata.get("checkpoint")
    if isinstance(checkpoint, dict) and checkpoint.get("path"):
        return Path(str(checkpoint["path"])).name
    return str(metadata["zoo_name"]) if metadata.get("zoo_name") else None


def model_label(model) -> str:
    """``"<zoo name or folder> (<architecture>)"``, or the architecture (``cfg.label``) alone."""
    name = model_name(model)
    arch = str(getattr(model.cfg, "label", type(model).__name__))
    if not name or arch == name or arch.startswith(f"{name} ("):  # HF labels start with their folder
        return arch
    return f"{name} ({arch})"


# (model class, adapter) of each family, registered by the family's own module when it loads
# (`register_family`): this module stays below the models and never looks them up.
_FAMILIES: list[tuple[type, type]] = []


def register_family(model_class: type, adapter: type) -> None:
    """Make `phase_model` wrap instances of ``model_class`` in ``adapter`` (each family's module calls
    this once, at import)."""
    if not any(cls is model_class for cls, _ in _FAMILIES):
        _FAMILIES.append((model_class, adapter))


def phase_model(model) -> PhaseModel:
    """The `PhaseModel` adapter of ``model`` (an adapter passes through); a name or path instead of a
    model is refused naming the loader."""
    if isinstance(model, _Family):
        return model
    check_is_model(model)
    for model_class, adapter in _FAMILIES:
        if isinstance(model, model_class):
            return adapter(model)
    return GenericModel(model)


@contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """``model`` in eval mode inside the block; afterwards (also after an exception) each submodule's
    own training flag as it was, so a model trained with some modules frozen in eval keeps them so."""
    flags = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for module, training in flags:
            module.training = training


__all__ = ["CompressedFamily", "DeepseekV4Family", "GateTarget", "eval_mode", "GenericModel", "KnockoutPoint", "PhaseModel",
           "phase_model", "register_family"]
