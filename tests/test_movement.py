"""Movement R² (issue 36, item 1): did the weak spot / the unit's peak move by the applied shift?

Oracle results are built prompt by prompt, so the displacement is known by construction: the
profile (or contribution) under shift d is the unshifted one rolled by d, or the unshifted one
itself (the spot stays put), or rolled the wrong way.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import phaseinterp as pi
from phaseinterp.errors import UserInputError
from phaseinterp.interventions.cycling_stats import (
    contribution_displacements,
    cycling_scores,
    movement_scores,
    profile_displacements,
    representative_shift,
    unit_score_arrays,
)
from phaseinterp.interventions.gate_cycling import CyclingResult

ACC0 = np.array([0.9, 0.4, 0.8, 0.6, 0.95, 0.15, 0.7, 0.1])  # S = 8, weak at phases 5 and the boundary 7
C0 = np.array([0.0, -0.1, 0.05, 0.0, 0.1, 2.0, 2.8, -0.05])  # a unit serving phases 5 and 6
SHIFTS = (-3, -2, -1, 1, 2, 3)


def _profile_oracle(moved_by, n: int = 60, acc0=ACC0, shifts=SHIFTS) -> CyclingResult:
    """Per-prompt correctness whose phase accuracy under shift d is exactly A_0 rolled by
    ``moved_by(d)`` (the boundary phase kept weak, as measured on the zoo models)."""
    S = len(acc0)
    R = 2 * S
    residue = np.repeat(np.arange(R), n)
    rows = []
    for d in (0, *shifts):
        acc = np.roll(acc0, moved_by(d) if d else 0)
        acc[S - 1] = acc0[S - 1]
        k = np.round(acc[residue % S] * n).astype(int)
        rows.append(np.concatenate([np.arange(n) < k[r * n] for r in range(R)]))
    return CyclingResult(shifts=(0, *shifts), residue=residue, correct=np.stack(rows), residue_modulus=R, stride=S,
                         n_boot=200)


def _unit_oracle(moved_by, n: int = 40, c0=C0, shifts=SHIFTS, noise: float = 0.3) -> pi.UnitCyclingResult:
    """Per-prompt contributions ``C_0((r - moved_by(d)) mod S)`` plus seeded noise."""
    rng = np.random.default_rng(0)
    S = len(c0)
    residue = np.repeat(np.arange(2 * S), n)
    all_shifts = (0, *shifts)
    shifted = np.stack([np.roll(c0, moved_by(d) if d else 0)[residue % S] + rng.normal(0, noise, residue.size)
                        for d in all_shifts])
    return pi.UnitCyclingResult(shifts=all_shifts, residue=residue, measure_shifted=shifted,
                                measure_knocked=np.zeros_like(shifted), correct_shifted=np.ones_like(shifted, bool),
                                residue_modulus=2 * S, stride=S, layers=(0,), kv_heads=None, n_boot=200)


# ------------------------------------------------------------------ whole profile
def test_profile_that_moves_by_the_applied_shift_scores_one_and_its_intervals_hold_the_truth():
    r = _profile_oracle(lambda d: d)
    m = r.movement()
    per = m["per_shift"].set_index("shift")
    assert per.displacement.to_dict() == {d: d for d in SHIFTS}
    assert m["movement_r2"] == pytest.approx(1.0, abs=1e-12) and m["movement_corr2"] == pytest.approx(1.0)
    assert ((per.low <= per.index) & (per.index <= per.high)).all()  # the bootstrap interval holds the truth
    assert m["n_points"] == 6 and m["movement_r2_ci"][0] <= 1.0 <= m["movement_r2_ci"][1] + 1e-12
    assert r.scores["movement_r2"] == pytest.approx(1.0)
    d = r.to_dict()
    assert d["movement_r2"] == pytest.approx(1.0) and d["displacement_ci_by_shift"][-3][0] <= -3
    assert {"movement_r2", "movement_r2_ci", "r2_pooled", "identified"} <= set(r.summary().index)


def test_profile_whose_weak_spot_stays_put_or_runs_backwards_scores_at_most_zero():
    stays = _profile_oracle(lambda d: 0)
    assert (stays.movement()["per_shift"].displacement == 0).all()
    assert stays.scores["movement_r2"] == -np.inf  # nothing moved while the applied shift varied
    backwards = _profile_oracle(lambda d: -d).movement()
    assert backwards["per_shift"].displacement.tolist() == [-d for d in SHIFTS]
    assert backwards["movement_r2"] == pytest.approx(-3.0)  # 1 - sum (2d)^2 / sum d^2
    assert backwards["movement_r2"] <= 0


def test_profile_displacements_agree_with_the_scores_column():
    rng = np.random.default_rng(0)
    for moved_by in (lambda d: d, lambda d: 0, lambda d: -d, lambda d: 2 * d):
        observed = {d: np.clip(np.roll(ACC0, moved_by(d)) + rng.normal(0, 0.05, 8), 0, 1) for d in SHIFTS}
        column = cycling_scores(ACC0, observed)["per_shift"].displacement.tolist()
        assert profile_displacements(ACC0, np.stack(list(observed.values()))).tolist() == column


def test_movement_survives_save_and_load(tmp_path):
    r = _profile_oracle(lambda d: d if abs(d) < 3 else 0, n=30)
    back = CyclingResult.load(r.save(tmp_path / "profile"))
    keys = ("movement_r2", "movement_r2_ci", "movement_corr2", "displacement_by_shift", "displacement_ci_by_shift")
    assert {k: back.to_dict()[k] for k in keys} == {k: r.to_dict()[k] for k in keys}
    assert r.to_dict()["displacement_by_shift"][-3] == 0 and r.scores["movement_r2"] < 1
    pd.testing.assert_frame_equal(back.movement()["per_shift"], r.movement()["per_shift"])
    u = _unit_oracle(lambda d: d)
    uback = pi.UnitCyclingResult.load(u.save(tmp_path / "unit"))
    assert uback.movement()["movement_r2"] == u.movement()["movement_r2"]
    pd.testing.assert_frame_equal(uback.movement()["per_shift"], u.movement()["per_shift"])


# ------------------------------------------------------------------ one unit
def test_unit_peak_that_moves_scores_one_and_one_that_stays_scores_at_most_zero():
    moving = _unit_oracle(lambda d: d)
    m = moving.movement()
    per = m["per_shift"].set_index("shift")
    assert per.displacement.to_dict() == {d: d for d in SHIFTS}
    assert m["movement_r2"] == pytest.approx(1.0, abs=1e-12)
    assert ((per.low <= per.index) & (per.index <= per.high)).all()
    assert moving.to_dict()["movement_r2"] == pytest.approx(1.0)
    assert "movement_r2" in moving.summary().index
    staying = _unit_oracle(lambda d: 0)
    assert staying.scores["movement_r2"] <= 0 and (staying.movement()["per_shift"].displacement == 0).all()


def test_unit_displacement_is_the_best_hypothesis_and_the_cross_correlation_argmax():
    u = _unit_oracle(lambda d: d + 1 if d == 2 else d, noise=0.5)
    c = u.contribution().to_numpy()
    arr = unit_score_arrays(c[0], c[1:], list(SHIFTS), boundary=7)
    disp = contribution_displacements(arr["ss_res_by_hypothesis"])
    assert disp.tolist() == u.scores["per_shift"].best.tolist()
    xcorr = np.array([[np.dot(row, np.roll(c[0], k)) for k in range(8)] for row in c[1:]])
    assert disp.tolist() == representative_shift(xcorr.argmax(-1), 8).tolist()
    assert disp.tolist() == [-3, -2, -1, 1, 3, 3]
    # one miss by one slot: 1 - 1 / sum (delta - mean)^2
    delta = np.array(disp, float)
    assert u.scores["movement_r2"] == pytest.approx(1 - 1 / ((delta - delta.mean()) ** 2).sum())


def test_one_shift_has_no_movement_r2():
    u = _unit_oracle(lambda d: d, shifts=(1,))
    assert np.isnan(u.scores["movement_r2"]) and np.isnan(u.to_dict()["movement_r2"])
    with pytest.raises(UserInputError, match=r"shifts=\[1\]: movement R² needs at least 2 shifts"):
        u.movement()


# ------------------------------------------------------------------ the statistic itself
def test_wrap_around_uses_one_fixed_representative():
    # an applied 3 at S = 4 is the same intervention as -1, and is compared as -1
    s = movement_scores([-1, 1], [3, 1], 4)
    assert s["per_shift"].applied.tolist() == [-1, 1] and s["movement_r2"] == pytest.approx(1.0)
    # a near miss across the wrap point counts in full: no unwrapping toward the applied shift
    s = movement_scores([4, -2, 3], [-3, -2, 3], 8)
    per = s["per_shift"]
    assert per.error.tolist() == [7, 0, 0] and per.circular_error.tolist() == [-1, 0, 0]
    assert s["movement_r2"] < 0


@pytest.mark.parametrize("args, kwargs, match", [
    (([1], [1], 4), {}, r"shifts=\[1\]: movement R² needs at least 2 shifts"),
    (([], [], 4), {}, r"shifts=\[\]: movement R² needs at least 2 shifts"),
    (([1, 0], [1, 4], 4), {}, r"shift=4 is 0 mod S=4"),
    (([1, 1], [1, 5], 4), {}, r"shifts=\[1, 5\] repeat a shift mod S=4"),
    (([1, 3], [1, 2], 4), {}, r"displacement=3 is out of range for S=4 \(-1\.\.2"),
    (([1.0, 2.0], [1, 2], 4), {}, r"displacement must hold integer"),
    (([1, 2, 2], [1, 2], 4), {}, r"displacement has shape \(3,\), expected \[\.\.\., 2\]"),
    (([1, 2], [1, 2], 1), {}, r"stride=1 must be an integer >= 2"),
    (([1, 2], [1, 2.5], 4), {}, r"shift=2\.5 must be an integer"),
    (([1, 2], [1, 2], 4), dict(confidence=1.5), r"confidence=1\.5 must be a number in \(0, 1\)"),
    (([1, 2], [1, 2], 4), dict(bootstrap=np.array([1, 2])), r"bootstrap has shape \(2,\)"),
])
def test_bad_movement_inputs_name_the_value(args, kwargs, match):
    with pytest.raises(UserInputError, match=match):
        movement_scores(*args, **kwargs)


def test_the_report_states_movement_beside_the_strict_r2_and_identification():
    from phaseinterp.report.sections.mechanisms import _cycling_html, _movement_html

    text = _cycling_html(_profile_oracle(lambda d: d, n=20), "oracle", "built to move")
    assert "Movement R²" in text and "<b>1.00</b>" in text and "Headline R²" in text and "Shift identification" in text
    assert "+1 &rarr; +1 [+1, +1]" in text
    assert "not defined" in _movement_html(_unit_oracle(lambda d: d, shifts=(1,)), "the unit's contribution peak")
