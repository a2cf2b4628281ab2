"""Which path a forward takes, decided by the hooks attached (docs/models.md, "Which path runs when").

`last_logits` (the answer logits; both model families) has three paths:

- ``"final"``: no hook attached. Every layer but the last over all positions, the last layer's
  attention and MLP at the final position only.
- ``"last_position"``: the only hooks attached are forward hooks on ``blocks.{l}.attn.hook_z``. The
  knockout engine's computation: the prefix once, with those hooks held back, then the final position
  ``p`` alone through the layers. ``hook_z`` fires once per layer with ``[batch, 1, head, d_head]``
  (position ``p`` only) and ``hook.ctx["query_range"] == (p, p + 1)``.
- ``"full"``: any other hook (or a backward hook), or ``path="full"``: ``model(tokens)[:, -1]``, every
  hook on its usual full shape.

Every path run is counted in ``model.path_counts`` (a `collections.Counter`), so a test or a user can
see which one ran.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from typing import Iterable

from phaseinterp.errors import UserInputError

PATHS = ("final", "last_position", "full")
Z_HOOK = re.compile(r"blocks\.\d+\.attn\.hook_z")


def has_hooks(point) -> bool:
    """Whether a hook is attached to ``point`` (a TransformerLens ``HookPoint``): a forward,
    forward-pre or backward hook, as ``run_with_hooks``, ``hooks()`` and ``add_hook`` attach them.
    The one such test of the package: a fast path that skips or reshapes a hook point's value runs
    only while this is False for every point it would skip, so attaching a hook never goes unseen."""
    return bool(point._forward_hooks or point._forward_pre_hooks or point._backward_hooks)


def hooked_points(model) -> dict:
    """``{name: hook point}`` of the model's hook points that have a hook attached."""
    return {name: point for name, point in model.hook_dict.items() if has_hooks(point)}


def last_logits_path(model, path: str = "auto") -> str:
    """The path `last_logits` takes: ``"final"``, ``"last_position"`` or ``"full"`` (module docstring).

    ``path="auto"`` decides from the hooks attached; ``path="full"`` asks for the full forward (a
    ``hook_z`` hook that must see every position)."""
    if path not in ("auto", "full"):
        raise UserInputError(f"path={path!r} is not one of ('auto', 'full')")
    hooked = hooked_points(model)
    if path == "full":
        return "full"
    if not hooked:
        return "final"
    z_only = all(Z_HOOK.fullmatch(name) and not point._forward_pre_hooks and not point._backward_hooks
                 for name, point in hooked.items())
    return "last_position" if z_only else "full"


def hooked_z_layers(model) -> list[int]:
    """The layers whose ``hook_z`` has a hook attached, ascending."""
    return sorted(int(name.split(".")[1]) for name in hooked_points(model) if Z_HOOK.fullmatch(name))


def record_path(model, path: str) -> None:
    """Count one run of ``path`` in ``model.path_counts``."""
    counts = getattr(model, "path_counts", None)
    if counts is not None:
        counts[path] += 1


@contextmanager
def query_context(hooks: Iterable, a: int, b: int):
    """Tell ``hooks`` which query positions the activation they are about to see covers: a hook
    function reads ``hook.ctx["query_range"] == (a, b)``, positions ``a .. b - 1`` (a chunked forward
    calls the per-query ``[pos, key_slot]`` hooks once per query chunk; the last-position path calls
    ``hook_z`` with ``(p, p + 1)``; the full forward with ``(start, start + pos)``)."""
    hooks = list(hooks)
    for hook in hooks:
        hook.ctx["query_range"] = (a, b)
    try:
        yield
    finally:
        for hook in hooks:
            hook.ctx.pop("query_range", None)


@contextmanager
def held_back(points: Iterable):
    """The forward hooks of ``points`` do not fire inside the block (the last-position path's prefix:
    ``hook_z`` fires at the final position only); restored exactly on exit, also when the body raises."""
    saved = [(point, dict(point._forward_hooks)) for point in points]
    for point, _ in saved:
        point._forward_hooks.clear()
    try:
        yield
    finally:
        for point, hooks in saved:
            point._forward_hooks.update(hooks)


__all__ = ["PATHS", "has_hooks", "held_back", "hooked_points", "hooked_z_layers", "last_logits_path",
           "query_context", "record_path"]
