"""Kept pretraining snapshots load (`load_snapshot`) and `benchmarks/pretrain_python_code.py probe` scores them."""

import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from phaseinterp.errors import UserInputError

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "pretrain_python_code.py"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A 4-step tiny run at the probes' 256-token length, snapshots kept at steps 2 and 4."""
    from pydoc_data.topics import topics

    from phaseinterp.config import preset
    from phaseinterp.train import pretrain, train_tokenizer
    from phaseinterp.train.pretrain import PretrainConfig

    root = tmp_path_factory.mktemp("runs")
    data = root / "topics.jsonl"
    data.write_text("".join(json.dumps({"text": p}) + "\n" for k in sorted(topics) for p in topics[k].split("\n\n")
                            if len(p) > 80))
    tokenizer = train_tokenizer(data, 1024, root / "tokenizer", progress=False)
    recipe = PretrainConfig(seq_len=256, global_batch=2, steps=4, warmup_steps=1, needle_fraction=0.0, probe_every=4,
                            probe_per_residue=1, checkpoint_every=2, keep_every=2, heldout_fraction=0.2)
    pretrain(preset("tiny", d_vocab=1024, n_ctx=256), data, tokenizer, recipe, out_dir=root / "runs" / "w4s4-s0",
             progress=False)
    return root


def _script():
    spec = importlib.util.spec_from_file_location("pretrain_python_code", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_load_snapshot_reads_each_kept_step(runs):
    import phaseinterp as pi
    from phaseinterp.train.pretrain import load_snapshot, snapshot_steps

    folder = runs / "runs" / "w4s4-s0"
    assert snapshot_steps(folder) == [2, 4]
    latest, final = load_snapshot(folder), pi.load(folder)
    assert latest.metadata["step"] == 4 and latest.metadata["tokens"] == 4 * 2 * 256
    assert all(torch.equal(a, b) for a, b in zip(latest.state_dict().values(), final.state_dict().values()))
    earlier = load_snapshot(folder, 2)
    assert earlier.metadata["step"] == 2
    assert any(not torch.equal(a, b) for a, b in zip(earlier.state_dict().values(), latest.state_dict().values()))
    with pytest.raises(UserInputError, match=r"step=3 is not a kept checkpoint .*\[2, 4\]"):
        load_snapshot(folder, 3)
    with pytest.raises(UserInputError, match="not a pretraining run folder"):
        load_snapshot(runs)


@pytest.mark.slow
def test_probe_writes_one_row_per_residue_and_skips_what_is_done(runs, capsys):
    script = _script()
    out = runs / "scores" / "probes.csv"

    def probe(*extra: str, to: Path = out) -> int:
        return script.main(["probe", "--root", str(runs / "runs"), "--arms", "w4s4-s0", "--out", str(to),
                            "--tokenizer", str(runs / "tokenizer"), "--probes", "copy,needle-in_sequence",
                            "--copy-per-residue", "72", "--needle-per-residue", "72", *extra])

    assert probe("--all-steps") == 0
    frame = pd.read_csv(out)
    assert list(frame.columns) == ["arm", "step", "tokens", "probe", "residue", "phase", "n", "accuracy", "ci_low",
                                   "ci_high"]
    assert len(frame) == 2 * 2 * 24 and set(frame.step) == {2, 4} and (frame.n == 72).all()
    assert (frame.phase == frame.residue % 4).all() and (frame.ci_low <= frame.accuracy).all()
    summary = pd.read_csv(out.with_name("probes-summary.csv"))
    assert len(summary) == 4 and {"mean", "worst_phase", "best_phase", "phase_gap", "period_p_value"} <= set(summary)
    printed = capsys.readouterr().out
    assert "w4s4-s0 step 4" in printed and "worst phase" in printed and "period" in printed
    assert probe("--step", "2,4") == 0 and len(pd.read_csv(out)) == len(frame)  # nothing scored twice
    assert probe("--step", "3") == 2  # not a kept snapshot
    assert probe(to=runs / "runs" / "x.csv") == 2 and not (runs / "runs" / "x.csv").exists()  # the runs: read only
