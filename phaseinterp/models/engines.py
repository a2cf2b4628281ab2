"""The last-position engine, one per family: the shared prefix once, then ``V`` variants of the
final position from layer ``L`` on.

An edit at the final position ``p`` (a knockout of ``hook_z`` there, say) changes nothing at earlier
positions, so an engine runs the prompts' prefix once and recomputes only position ``p`` for each
variant, through the edited layer and the later ones. It computes the unhooked model: it is built
only while no hook is attached (`require_unhooked`), and ``variants`` fires only the ``hook_z`` hooks
it is given, with ``[batch * V, 1, head, d_head]`` and ``hook.ctx["query_range"] == (p, p + 1)``
(row ``r``: prompt ``r // V``, variant ``r % V``). Its numbers equal the hooked full forward's to 1e-5
(``tests/test_interventions.py::test_fast_ablation_equals_naive``, ``tests/test_deepseek_v4.py``).

- `CompressedEngine` (`CompressedTransformer`): a KV cache of the prefix (`prefix_cache`), then
  `Block.forward_last` for the final token. `CompressedPrefix` shares layers ``0 .. L-1`` between
  engines built under different parameters of layers ``L ..`` (gate shifts of layer ``L``).
- `DeepseekV4Engine` (`HookedDeepseekV4`): one clean pass keeps each layer's `LayerState`
  (`models.hf.last_position.clean_states`), then `block_forward_last` per layer.
"""

from __future__ import annotations

from typing import Optional, Sequence

from torch import Tensor

from phaseinterp.errors import UserInputError
from phaseinterp.models.cache import KVCache
from phaseinterp.models.hf.last_position import _rope, block_forward_last, clean_states, logits_last
from phaseinterp.models.paths import Z_HOOK, attached_hooks, record_path
from phaseinterp.models.protocol import phase_model


def require_unhooked(model, what: str = "the last-position engine") -> None:
    """Raise naming the attached hooks: an engine computes the unhooked model only."""
    names = attached_hooks(model)
    if names:
        raise UserInputError(f"{what} cannot run hooks at every position; hooks are attached at {', '.join(names)} "
                             "(experiments take the hooked full forward instead)")


def _check_variant_hooks(fwd_hooks: Sequence[tuple], layer: int) -> None:
    for name, _ in fwd_hooks:
        if not (isinstance(name, str) and Z_HOOK.fullmatch(name) and int(name.split(".")[1]) >= layer):
            raise UserInputError(f"the last-position engine runs hook_z hooks of layers >= {layer} only; got {name!r}")


class CompressedPrefix:
    """Layers ``0 .. upto - 1`` of a `CompressedTransformer` over ``tokens[:, :p]`` (the prefix) and the
    final token, ``p = tokens.shape[1] - 1``: the cache of those layers, the prefix's residual entering
    layer ``upto``, the final token's residual entering each layer ``<= upto``."""

    def __init__(self, model, tokens: Tensor, upto: int = 0):
        require_unhooked(model)
        self.model, self.tokens, self.upto = model, tokens, upto
        p = tokens.shape[1] - 1
        self.cache = model.init_cache()
        self.resid = model.prefix_cache(tokens[:, :p], self.cache, range(upto))
        last = model.W_E[tokens[:, p:p + 1].long()]
        self.resid_pre = []
        for layer in range(upto):
            self.resid_pre.append(last)
            last = model.blocks[layer].forward_last(last, self.cache.layers[layer])
        self.last = last

    def engine(self) -> "CompressedEngine":
        """The layers from ``upto`` on under the model's current parameters: an engine."""
        return CompressedEngine(self.model, self.tokens, self)


class CompressedEngine:
    """The own family's last-position engine over ``tokens`` ``[n, p + 1]`` (module docstring);
    ``clean`` is ``[n, vocab]``, the logits at ``p``."""

    def __init__(self, model, tokens: Tensor, prefix: Optional[CompressedPrefix] = None):
        prefix = prefix if prefix is not None else CompressedPrefix(model, tokens, 0)
        require_unhooked(model)
        self.model = model
        p = tokens.shape[1] - 1
        n_layers = model.cfg.n_layers
        self.cache = KVCache(layers=list(prefix.cache.layers), length=prefix.cache.length)
        model.prefix_cache(tokens[:, :p], self.cache, range(prefix.upto, n_layers), prefix.resid)
        self.resid_pre = list(prefix.resid_pre)
        last = prefix.last
        for layer in range(prefix.upto, n_layers):
            self.resid_pre.append(last)
            last = model.blocks[layer].forward_last(last, self.cache.layers[layer])
        record_path(model, "last_position")
        self.clean = model.unembed(last)[:, 0]

    def variants(self, layer: int, n_variants: int, fwd_hooks: Sequence[tuple]) -> Tensor:
        """``[n, V, vocab]``: the final position from ``layer`` on, ``V = n_variants`` copies of each
        prompt, the ``hook_z`` hooks ``fwd_hooks`` attached (they tell the variants apart)."""
        _check_variant_hooks(fwd_hooks, layer)
        model = self.model
        with model.hooks(fwd_hooks=list(fwd_hooks)):  # hook_z fires inside forward_last
            r = self.resid_pre[layer].expand(-1, n_variants, -1)
            for later in range(layer, model.cfg.n_layers):
                r = model.blocks[later].forward_last(r, self.cache.layers[later])
        record_path(model, "last_position")
        return model.unembed(r)


class DeepseekV4Engine:
    """DeepSeek-V4's last-position engine over ``tokens`` ``[n, p + 1]`` (module docstring); ``clean``
    is ``[n, vocab]``, the logits at ``p`` from the clean pass (its last layer at ``p`` only)."""

    def __init__(self, model, tokens: Tensor):
        require_unhooked(model)
        self.model, self.tokens = model, tokens
        self.clean, self.states = clean_states(model, tokens)
        record_path(model, "last_position")
        self.rope = _rope(model, tokens.shape[1] - 1, self.states[0].attn_in)

    def variants(self, layer: int, n_variants: int, fwd_hooks: Sequence[tuple]) -> Tensor:
        """As `CompressedEngine.variants`."""
        _check_variant_hooks(fwd_hooks, layer)
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


def last_position_engine(model, tokens: Tensor):
    """The family's engine over ``tokens`` (cut after the answer position): `CompressedEngine` or
    `DeepseekV4Engine`; refuses while a hook is attached or where the family has none."""
    family = phase_model(model)
    if not family.has_fast_ablation:
        raise UserInputError(f"{type(model).__name__} has no last-position engine here (PhaseModel.has_fast_ablation "
                             "is False: offloaded layers, or a model outside the two families)")
    if family.family == "compressed":
        return CompressedEngine(model, tokens)
    return DeepseekV4Engine(model, tokens)


__all__ = ["CompressedEngine", "CompressedPrefix", "DeepseekV4Engine", "last_position_engine", "require_unhooked"]
