"""Errors by kind (issue 35, item 6): a check of the caller's input raises `UserInputError` (a
ValueError, so ``except ValueError`` still catches it), never a plain ValueError; the layer check,
the integer check and the hook test each exist once."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
from transformer_lens.hook_points import HookPoint

from phaseinterp._checks import check_int, check_layer
from phaseinterp.errors import UserInputError
from phaseinterp.models.paths import has_hooks

ROOT = Path(__file__).resolve().parents[1] / "phaseinterp"

# A plain ValueError that stays: (path under phaseinterp/, a piece of its message) -> why it is not the
# caller's input. Each one carries a ``# internal:`` comment at the raise.
INTERNAL_VALUE_ERRORS = {
    ("zoo/__init__.py", "uses the equal-training rule but names no pair"):
        "ZOO is the package's own table: an entry without its pair is a bug in phaseinterp, not bad input",
    ("_files.py", "is not one of {READ_EXPECTS}"):
        "check_read_path's expect is a literal in each reader of the package, never the caller's",
    ("paper/build.py", "prompt counts reproduce its Wilson intervals"):
        "the paper's own export pins one prompt count per profile; another count means the export changed",
}


def _plain_value_errors(root: Path = ROOT) -> list[tuple[str, int, str]]:
    """(path, line, source) of every ``raise ValueError`` / ``raise ValueError(...)`` under ``root``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.Raise) or node.exc is None:
                continue
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(exc, ast.Name) and exc.id == "ValueError":
                found.append((path.relative_to(root).as_posix(), node.lineno, ast.get_source_segment(source, node)))
    return found


def test_no_plain_value_error_outside_the_internal_list():
    found = _plain_value_errors()
    unlisted = [(path, line, src) for path, line, src in found
                if not any(path == p and piece in src for p, piece in INTERNAL_VALUE_ERRORS)]
    assert not unlisted, ("a check of the caller's input raises UserInputError (phaseinterp.errors); an internal "
                          f"invariant goes into INTERNAL_VALUE_ERRORS with its reason: {unlisted}")
    stale = [key for key in INTERNAL_VALUE_ERRORS
             if not any(path == key[0] and key[1] in src for path, _, src in found)]
    assert not stale, f"allow-listed ValueErrors that no longer exist: {stale}"


def test_each_internal_value_error_says_so_at_the_raise():
    for path, line, _ in _plain_value_errors():
        before = (ROOT / path).read_text().splitlines()[line - 2]
        assert "# internal:" in before, f"{path}:{line}: say why this ValueError is internal (# internal: ...)"


def test_the_static_check_finds_a_planted_value_error(tmp_path):
    (tmp_path / "m.py").write_text("def f(x):\n    if x:\n        raise ValueError(f'x={x}')\n"
                                   "    raise UserInputError('y')\n")
    assert _plain_value_errors(tmp_path) == [("m.py", 3, "raise ValueError(f'x={x}')")]


# ----------------------------------------------------------------- check_layer
@pytest.mark.parametrize("layer, message", [
    (31, r"^layer=31 is out of range for a 12-layer model \(0\.\.11\)$"),
    (12, r"^layer=12 is out of range for a 12-layer model \(0\.\.11\)$"),
    (-1, r"^layer=-1 is out of range for a 12-layer model \(0\.\.11\)$"),
    (True, r"^layer=True is not a layer index \(an integer in 0\.\.11 for a 12-layer model\)$"),
    (1.0, r"^layer=1\.0 is not a layer index"),
    ("3", r"^layer='3' is not a layer index"),
    (None, r"^layer=None is not a layer index"),
])
def test_check_layer_refuses_with_the_valid_range(layer, message):
    with pytest.raises(UserInputError, match=message):
        check_layer(layer, 12)


def test_check_layer_names_the_argument_and_accepts_numpy_ints():
    assert check_layer(np.int64(3), 4) == 3 and type(check_layer(np.int64(3), 4)) is int
    assert check_layer(0, 1) == 0
    with pytest.raises(UserInputError, match=r"^layers=5 is out of range for a 2-layer model \(0\.\.1\)$"):
        check_layer(5, 2, name="layers")
    assert issubclass(UserInputError, ValueError)


def test_check_int_messages():
    assert check_int("n", np.int32(4), 1) == 4
    with pytest.raises(UserInputError, match=r"^n=0 must be an integer >= 1$"):
        check_int("n", 0)
    with pytest.raises(UserInputError, match=r"^n=True must be an integer >= 1$"):
        check_int("n", True)
    with pytest.raises(UserInputError, match=r"^n=9 is out of range \(valid: 1\.\.8\) \(why\)$"):
        check_int("n", 9, 1, 8, why=" (why)")
    with pytest.raises(UserInputError, match=r"^n=1\.5 must be an integer in 1\.\.8$"):
        check_int("n", 1.5, 1, 8)


# ----------------------------------------------------------------- layer checks use it
def test_the_models_layer_checks_are_check_layer():
    from phaseinterp import CompressedConfig, CompressedTransformer
    from phaseinterp.models.protocol import phase_model

    model = CompressedTransformer(CompressedConfig(d_vocab=16, n_ctx=16, d_model=16, n_layers=2, n_heads=2,
                                                   n_kv_heads=1, d_head=8, d_mlp=32, window=4, stride=4))
    for call in (lambda: model.gate_parameters(2), lambda: phase_model(model).kv_heads(True),
                 lambda: phase_model(model).window_offsets(-1)):
        with pytest.raises(UserInputError, match=r"layer=(2|True|-1) (is out of range for a 2-layer model \(0\.\.1\)|"
                                                 r"is not a layer index)"):
            call()


# ----------------------------------------------------------------- has_hooks
def test_has_hooks_asks_transformer_lens_s_registry():
    """Forward, backward and permanent TransformerLens hooks count; nothing private to torch is read."""
    point = HookPoint()
    assert not has_hooks(point)
    point.add_hook(lambda x, hook: x)
    assert has_hooks(point)
    point.remove_hooks()
    assert not has_hooks(point)
    point.add_perma_hook(lambda x, hook: x)
    assert has_hooks(point)
    point.remove_hooks(including_permanent=True)
    assert not has_hooks(point)
    point.add_hook(lambda grad, hook: None, dir="bwd")
    assert has_hooks(point)
    point.remove_hooks(dir="both")
    assert not has_hooks(point)


# ----------------------------------------------------------------- converted public checks
def test_public_checks_that_were_plain_value_errors_are_user_input_errors():
    from phaseinterp import stats
    from phaseinterp.engines import chunked_pieces
    from phaseinterp.tasks import Vocab

    with pytest.raises(UserInputError, match=r"confidence=1\.5 must be a number in \(0, 1\)"):
        stats.wilson_interval(3, 10, confidence=1.5)
    with pytest.raises(UserInputError, match=r"method='x' is not one of \('holm', 'bh'\)"):
        stats.adjust_p_values([0.1, 0.2], method="x")
    with pytest.raises(UserInputError, match=r"chunk=6 must be a multiple of the cut period 4"):
        chunked_pieces(128, 1, 4, 6)
    with pytest.raises(UserInputError, match=r"token id 500 is out of range for this vocabulary"):
        Vocab.default().decode([500])
    with pytest.raises(UserInputError, match=r"is not a known task"):
        from phaseinterp.tasks import task_from_dict

        task_from_dict({"kind": "nosuch"})
