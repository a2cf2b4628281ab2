"""Hook bookkeeping shared by both families: which hook points have a hook attached, the query
(and entry) ranges a hook is told, and the checked hook registry.

Each family has one forward with a KV cache (docs/models.md, "One forward"): every hook fires on
the positions each call computes, ``hook.ctx["query_range"]`` saying which (docs/hooks.md, "The
rule"). Whether a hook is attached is TransformerLens's own registry (``HookPoint.has_hooks``: hooks
added by ``add_hook``, ``hooks()``, ``run_with_hooks``, ``run_with_cache``); no private torch state is
read. A hook attached with torch's raw ``register_forward_hook`` is not a TransformerLens hook and is
not seen.
"""

from __future__ import annotations

import functools
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Union

import torch
from transformer_lens.ActivationCache import ActivationCache
from transformer_lens.HookedRootModule import HookedRootModule, Slice

from phaseinterp._checks import check_device, check_layer, check_name
from phaseinterp.errors import UserInputError



def has_hooks(point) -> bool:
    """Whether a TransformerLens hook (forward or backward, context or permanent) is attached to
    ``point``: TransformerLens's registry, ``HookPoint.has_hooks()``."""
    return bool(point.has_hooks())


def hooked_points(model) -> dict:
    """``{name: hook point}`` of the model's hook points that have a hook attached."""
    return {name: point for name, point in model.hook_dict.items() if has_hooks(point)}


def attached_hooks(model) -> list[str]:
    """Names of the hook points with a hook attached, in the model's order."""
    return list(hooked_points(model))


def refuse_hooks(model, what: str) -> None:
    """Raise naming the attached hooks: ``what`` (an engine comparison, say) cannot honour them."""
    names = attached_hooks(model)
    if names:
        shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
        raise UserInputError(f"{what} cannot honour the hooks attached at {shown}: it compares implementations "
                             "of the model as stored; remove them first (model.reset_hooks(including_permanent=True))")


def query_context(hooks: Iterable, a: int, b: int, key: str = "query_range"):
    """Tell ``hooks`` which positions the activation they are about to see covers: a hook function
    reads ``hook.ctx["query_range"] == (a, b)``, positions ``a .. b - 1`` (each call of the forward
    sets it model-wide to the positions it computes; a chunked attention calls the per-query ``[pos,
    key_slot]`` hooks once per query chunk, with that chunk's range). ``key="entry_range"``: the
    compressed entries ``a .. b - 1`` a compressor's per-entry hooks see. The previous value is put
    back afterwards."""
    return hook_context(hooks, key, (a, b))


@contextmanager
def hook_context(hooks: Iterable, key: str, value: Any):
    """``hook.ctx[key] = value`` for each of ``hooks`` inside the block, the previous value (or none)
    put back afterwards."""
    hooks = list(hooks)
    saved = [hook.ctx.get(key) for hook in hooks]
    for hook in hooks:
        hook.ctx[key] = value
    try:
        yield
    finally:
        for hook, old in zip(hooks, saved):
            if old is None:
                hook.ctx.pop(key, None)
            else:
                hook.ctx[key] = old


class CheckedHooks(HookedRootModule):
    """TransformerLens's ``HookedRootModule`` with the two checks a hook needs before a run: its name
    is one of the model's hook points (a misspelt name, or a filter that matches none, is one error
    naming the closest names instead of a ``KeyError`` or a silent no-op), and what the hook returns
    has the shape of what it was given (else one error naming the hook point and both shapes,
    instead of a broadcasting error deep in the forward). Also what both families share: an
    ``ActivationCache`` from ``run_with_cache`` and the layer check."""

    def run_with_cache(self, *model_args: Any, return_cache_object: bool = True, **kwargs: Any):
        """TransformerLens's ``run_with_cache``; wraps the activations in an ``ActivationCache``
        (``return_cache_object=False`` gives the plain dict)."""
        out, cache_dict = super().run_with_cache(*model_args, **kwargs)
        if not return_cache_object:
            return out, cache_dict
        return out, ActivationCache(cache_dict, self, has_batch_dim=not kwargs.get("remove_batch_dim", False))

    def _check_layer(self, layer: int) -> None:
        check_layer(layer, self.cfg.n_layers)

    def _hook_names(self, name: Union[str, Callable[[str], bool]]) -> list[str]:
        if isinstance(name, str):
            check_name("hook name", name, self.hook_dict, shown=f"hook name {name!r}", what="a hook point of this model",
                       where="model.hook_dict lists them", n_close=3, cutoff=0.5)
            return [name]
        if not callable(name):
            raise UserInputError(f"a hook's name must be a hook point's name or a filter on names, got {name!r}")
        names = [n for n in self.hook_dict if name(n)]
        if not names:
            raise UserInputError(f"the hook filter {name!r} matches no hook point of this model (model.hook_dict "
                                 "lists them)")
        return names

    def check_names_filter(self, names_filter: Any) -> None:
        """A ``names_filter`` (of ``run_with_cache``, ``get_caching_hooks``) that names a point this model
        lacks, or matches none, is one error naming it and the closest names, never an empty or partial
        cache: a name, a list of names (each checked) or a filter (it must match a point); None is all."""
        if names_filter is None:
            return
        if isinstance(names_filter, str):
            self._hook_names(names_filter)
        elif isinstance(names_filter, (list, tuple, set, frozenset)):
            if not names_filter:
                raise UserInputError("names_filter=[] names no hook point: pass names (model.hook_dict lists them), "
                                     "a filter on names, or None for every point")
            for name in names_filter:
                if not isinstance(name, str):
                    raise UserInputError(f"names_filter entry {name!r} is not a hook point's name")
                self._hook_names(name)
        elif callable(names_filter):
            self._hook_names(names_filter)
        else:
            raise UserInputError(f"names_filter={names_filter!r} is not a hook point's name, a list of names, a "
                                 "filter on names or None")

    def get_caching_hooks(self, names_filter=None, *args, **kwargs):  # run_with_cache
        """TransformerLens's, with the names check. ``pos_slice`` is refused: TransformerLens picks the
        position axis by the hook's name, and many of these hooks lay their axes out otherwise (docs/hooks.md),
        so it would slice heads, slots or streams without a word."""
        self.check_names_filter(names_filter)
        pos_slice = kwargs.get("pos_slice", args[4] if len(args) > 4 else None)
        if pos_slice is not None and Slice.unwrap(pos_slice).mode != "identity":
            raise UserInputError("run_with_cache's pos_slice is refused here: TransformerLens looks for the position "
                                 "axis by the hook's name, and many of these hooks lay it out elsewhere (docs/hooks.md "
                                 "gives each layout); cache whole and slice the positions you need")
        return super().get_caching_hooks(names_filter, *args, **kwargs)

    def add_caching_hooks(self, names_filter=None, incl_bwd: bool = False, device=None, remove_batch_dim: bool = False,
                          cache: dict | None = None) -> dict:
        """TransformerLens's ``add_caching_hooks`` made of this model's `get_caching_hooks`: the same
        names check and (DeepSeek-V4) the same joining of query chunks as ``run_with_cache``; ``device``
        (where the activations are kept) is checked before a hook is added."""
        device = None if device is None else check_device(device)
        cache, fwd, bwd = self.get_caching_hooks(names_filter, incl_bwd, device, remove_batch_dim, cache)
        for hooks, direction in ((fwd, "fwd"), (bwd, "bwd")):
            for name, fn in hooks:
                self.hook_dict[name].add_hook(fn, direction)
        return cache

    def _enable_hook(self, name, hook, dir="fwd"):  # hooks(), run_with_hooks
        for point in self._hook_names(name):
            self.hook_dict[point].add_hook(shape_checked(point, hook), dir=dir, level=self.context_level)

    def add_hook(self, name, hook, dir="fwd", is_permanent=False, level=None, prepend=False):
        for point in self._hook_names(name):
            super().add_hook(point, shape_checked(point, hook), dir=dir, is_permanent=is_permanent, level=level,
                             prepend=prepend)


def shape_checked(name: str, hook: Callable) -> Callable:
    """``hook`` refusing to return anything but None or a tensor of the shape it was given."""

    @functools.wraps(hook)
    def checked(value, hook=None):
        out = hook_fn(value, hook=hook)
        if out is not None and isinstance(value, torch.Tensor) and not isinstance(out, torch.Tensor):
            raise UserInputError(f"the hook on {name} returned a {type(out).__name__}: a hook must return None or a "
                                 f"tensor of the shape it is given ({tuple(value.shape)})")
        if isinstance(out, torch.Tensor) and isinstance(value, torch.Tensor) and out.shape != value.shape:
            raise UserInputError(f"the hook on {name} returned shape {tuple(out.shape)} for an activation of shape "
                                 f"{tuple(value.shape)}: a hook must return None or a tensor of the shape it is given")
        return out

    hook_fn = hook
    return checked


__all__ = ["CheckedHooks", "attached_hooks", "has_hooks", "hook_context", "hooked_points", "query_context", "refuse_hooks",
           "shape_checked"]
