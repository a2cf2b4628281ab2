"""`HookedDeepseekV4` beside transformers' eager forward, exact ties in the indexer handled.

The Lightning Indexer's score ``sum_h w_h relu(q_h . k)`` is exactly 0.0 for an entry every index
head scores negative, so entries tie, and a query's top-k may have to choose among them. Such ties
are not part of the model: transformers breaks them with ``torch.topk``, whose choice depends on the
row's length and the device; phaseinterp gives them to the lowest entry indices (`compressor.top_k_set`), the
same in every call layout. So the two are compared as a reader of the model would: with
transformers' selection put in place of phaseinterp's at every CSA layer (``indexer.hook_selected``),
the logits must agree to float precision; and at every query of every CSA layer, the two selections
must be the same set of scores (``rows_apart == 0``), differing at most among tied entries
(``rows_tied_apart``).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Callable, ContextManager, NamedTuple, Optional, Sequence

import torch
from torch import Tensor

from phaseinterp.models.hf.config import CSA


class TransformersCheck(NamedTuple):
    """`check_against_transformers`' answer: ``max_abs_diff`` of the logits (transformers' selection in
    place), the indexer rows compared (prompts x positions x CSA layers), those whose selections differ
    only among entries tied at the k-th score, and those that differ otherwise (0 unless the models
    differ)."""

    max_abs_diff: float
    rows: int
    rows_tied_apart: int
    rows_apart: int

    @property
    def ok(self) -> bool:
        return self.rows_apart == 0


@torch.inference_mode()
def check_against_transformers(model, tokens: Tensor, fwd_hooks: Sequence = (),
                               edit_transformers: Optional[Callable[[], ContextManager]] = None) -> TransformersCheck:
    """Run ``tokens`` ``[batch, pos]`` through ``model.hf`` (eager, no cache) and through ``model`` with
    transformers' indexer selection in place of its own (module docstring). ``fwd_hooks``: hooks of
    ``model``'s run, an edit whose counterpart in transformers' weights ``edit_transformers()`` (a context
    manager, entered around transformers' run only: the weights are shared) makes."""
    hf = model.hf
    csa = [layer for layer, kind in enumerate(model.cfg.layer_types) if kind == CSA]
    theirs: dict[int, Tensor] = {}
    indexers = {layer: hf.model.layers[layer].self_attn.compressor.indexer for layer in csa}
    handles = [module.register_forward_hook(lambda mod, inp, out, layer=layer: theirs.__setitem__(layer, out))
               for layer, module in indexers.items()]
    try:
        with edit_transformers() if edit_transformers is not None else nullcontext():
            reference = hf(tokens, use_cache=False).logits
    finally:
        for handle in handles:
            handle.remove()
    scores: dict[int, list[Tensor]] = {layer: [] for layer in csa}
    rows = [0, 0, 0]

    def keep_scores(t: Tensor, hook) -> None:
        scores[int(hook.name.split(".")[1])].append(t)

    def force(selected: Tensor, hook) -> Tensor:
        layer = int(hook.name.split(".")[1])
        row_scores = torch.cat(scores[layer], dim=1)
        scores[layer].clear()
        their = theirs[layer].to(selected.device)

        def chosen_scores(sel: Tensor) -> Tensor:
            got = row_scores.gather(-1, sel.clamp(min=0)).masked_fill(sel < 0, float("-inf"))
            return got.sort(-1).values

        same_set = (selected.sort(-1).values == their.clamp(min=-1).sort(-1).values).all(-1)
        same_scores = (chosen_scores(selected) == chosen_scores(their)).all(-1)
        rows[0] += same_set.numel()
        rows[1] += int((same_scores & ~same_set).sum())
        rows[2] += int((~same_scores).sum())
        return their

    hooks = list(fwd_hooks) + [(f"blocks.{layer}.attn.compressor.indexer.hook_scores", keep_scores) for layer in csa]
    hooks += [(f"blocks.{layer}.attn.compressor.indexer.hook_selected", force) for layer in csa]
    with model.hooks(fwd_hooks=hooks):
        ours = model(tokens)
    diff = float((ours.float() - reference.to(ours.device).float()).abs().max())
    return TransformersCheck(diff, *rows)


__all__ = ["TransformersCheck", "check_against_transformers"]
