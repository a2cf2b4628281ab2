"""Data-parallel experiments (phaseinterp.parallel): 2 processes on the gloo backend give the
single-process result; a killed rank's rerun computes only what is missing; shards of another
run are refused, naming the field."""

from __future__ import annotations

import io
import os
import re
import shutil
import socket
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import torch.multiprocessing as mp

from phaseinterp import parallel
from phaseinterp.parallel import runs
from phaseinterp.interventions import ablate, gate_cycling_profile
from phaseinterp.profile import phase_profile

pytestmark = pytest.mark.usefixtures("one_thread")


CHUNK = 4  # 16 prompts -> chunks 0..3; rank 0 takes 0 and 2, rank 1 takes 1 and 3
N_CHUNKS = 4


def _task():
    from phaseinterp.tasks import KeyValueRetrieval

    return KeyValueRetrieval(seq_len=64, n_records=8, n_demos=2, min_distance=20, residue_modulus=8)


def _model(seed: int = 0):
    from phaseinterp import CompressedConfig, CompressedTransformer

    cfg = CompressedConfig(d_vocab=_task().vocab.size, n_ctx=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                           d_head=8, d_mlp=64, window=4, stride=4, seed=seed)
    model = CompressedTransformer(cfg)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # gates away from their zero init, so phases differ
        for name, p in model.named_parameters():
            if name.endswith(("b_k", "b_v")) or ".Z_" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
    return model.eval()


def _prompts(seed: int = 0):
    return _task().generate(2, seed=seed, strict=False)


def _experiment(kind: str, model, out_dir, prompts, **kwargs):
    common = dict(out_dir=out_dir, prompts=prompts, chunk_size=CHUNK, progress=False, **kwargs)
    if kind == "profile":
        return parallel.sharded_profile(model, _task(), **common)
    if kind == "ablate":
        return parallel.sharded_ablate(model, _task(), n_calibration=8, batch_size=3, **common)
    return parallel.sharded_gate_cycling_profile(model, _task(), batch_size=3, **common)


def _single(kind: str, model, prompts):
    if kind == "profile":
        return phase_profile(model, prompts, progress=False)
    if kind == "ablate":
        return ablate(model, _task(), prompts=prompts, n_calibration=8, batch_size=3, progress=False)
    return gate_cycling_profile(model, _task(), prompts=prompts, batch_size=3, progress=False)


def _worker(rank: int, world: int, port: int, job: dict) -> None:
    """One rank, launched as torchrun would: the process group comes from the environment."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), PHASEINTERP_NO_PROGRESS="1")
    torch.set_num_threads(1)
    write = runs.write_shard
    log = Path(job["root"]) / f"computed-rank{rank}.txt"

    def logged_write(path, header, chunk, index, arrays):  # the count of chunks this rank computed
        write(path, header, chunk, index, arrays)
        with open(log, "a") as f:
            f.write(f"{chunk}\n")
        if job.get("crash_rank") == rank:  # killed after its first chunk, once rank 0 is done
            others = [parallel.shard_path(Path(path).parent.parent, c) for c in range(0, N_CHUNKS, world)]
            deadline = time.time() + 60
            while not all(p.is_file() for p in others) and time.time() < deadline:
                time.sleep(0.05)
            (Path(job["root"]) / f"crashed-rank{rank}").touch()
            raise RuntimeError("simulated crash")

    runs.write_shard = logged_write
    model, prompts = _model(), _prompts()
    for kind in job["kinds"]:
        result = _experiment(kind, model, Path(job["root"]) / kind, prompts)
        if rank == 0:
            result.save(Path(job["root"]) / f"result-{kind}")
        else:
            assert result is None
    torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(job: dict, world: int = 2) -> None:
    mp.start_processes(_worker, args=(world, _free_port(), job), nprocs=world, join=True, start_method="spawn")


def _computed(root: Path) -> dict[int, list[int]]:
    out = {}
    for rank in (0, 1):
        path = root / f"computed-rank{rank}.txt"
        out[rank] = [int(x) for x in path.read_text().split()] if path.is_file() else []
        path.unlink(missing_ok=True)
    return out


def _assert_same(kind: str, merged, single) -> None:
    if kind == "profile":
        exact = [c for c in single.records.columns if c != "answer_logprob"]
        pd.testing.assert_frame_equal(merged.records[exact], single.records[exact])
        np.testing.assert_allclose(merged.records.answer_logprob, single.records.answer_logprob, rtol=0, atol=1e-5)
        np.testing.assert_array_equal(merged.residue_accuracy, single.residue_accuracy)
        np.testing.assert_array_equal(merged.phase_lower, single.phase_lower)
        assert merged.period == single.period and merged.period_p_value == single.period_p_value
    elif kind == "ablate":
        np.testing.assert_array_equal(merged.residue, single.residue)
        np.testing.assert_array_equal(merged.clean_correct, single.clean_correct)
        np.testing.assert_array_equal(merged.knockout_correct, single.knockout_correct)
        np.testing.assert_allclose(merged.clean_logit_answer, single.clean_logit_answer, rtol=0, atol=1e-5)
        np.testing.assert_allclose(merged.knockout_logit_answer, single.knockout_logit_answer, rtol=0, atol=1e-5)
        pd.testing.assert_frame_equal(merged.units, single.units)
        pd.testing.assert_frame_equal(merged.relative_change, single.relative_change)
        assert (merged.scope, merged.n_calibration, merged.model_label) == (
            single.scope, single.n_calibration, single.model_label)
    else:
        assert merged.shifts == single.shifts
        np.testing.assert_array_equal(merged.residue, single.residue)
        np.testing.assert_array_equal(merged.correct, single.correct)
        pd.testing.assert_frame_equal(merged.phase_accuracy(), single.phase_accuracy())


def _load(kind: str, path: Path):
    from phaseinterp.interventions.ablation import AblationResult
    from phaseinterp.interventions.gate_cycling import CyclingResult
    from phaseinterp.profile import PhaseProfile

    return {"profile": PhaseProfile, "ablate": AblationResult, "cycle": CyclingResult}[kind].load(path)


@pytest.mark.slow  # spawns processes
def test_two_ranks_equal_one_process(tmp_path):
    kinds = ["profile", "ablate", "cycle"]
    _launch(dict(root=str(tmp_path), kinds=kinds))
    model, prompts = _model(), _prompts()
    computed = _computed(tmp_path)
    assert computed == {0: [0, 2] * 3, 1: [1, 3] * 3}  # each rank its own slice, each chunk once
    for kind in kinds:
        single = _single(kind, model, prompts)
        _assert_same(kind, _load(kind, tmp_path / f"result-{kind}"), single)
        _assert_same(kind, parallel.merge(tmp_path / kind), single)  # from the files alone
        assert sorted(p.name for p in (tmp_path / kind / "shards").iterdir()) == [
            f"chunk-{c:06d}.npz" for c in range(N_CHUNKS)]


@pytest.mark.slow  # spawns processes
def test_killed_rank_rerun_computes_only_the_missing_chunks(tmp_path):
    # spawn re-raises whichever rank fails first: rank 1's crash, or rank 0 losing its peer in gloo
    with pytest.raises(Exception, match="simulated crash|Connection closed by peer"):
        _launch(dict(root=str(tmp_path), kinds=["ablate"], crash_rank=1))
    assert (tmp_path / "crashed-rank1").is_file()
    first = _computed(tmp_path)
    assert first == {0: [0, 2], 1: [1]}
    shards = tmp_path / "ablate" / "shards"
    before = {p.name: p.stat().st_mtime_ns for p in shards.iterdir()}
    assert sorted(before) == [f"chunk-{c:06d}.npz" for c in (0, 1, 2)]
    with pytest.raises(ValueError, match=r"lacks 1 of 4 chunks \(prompts 12\.\.15\)"):
        parallel.merge(tmp_path / "ablate")

    _launch(dict(root=str(tmp_path), kinds=["ablate"]))  # the same command again
    assert _computed(tmp_path) == {0: [], 1: [3]}  # only the killed rank's unfinished chunk
    after = {p.name: p.stat().st_mtime_ns for p in shards.iterdir()}
    assert {name: after[name] for name in before} == before  # finished shards untouched
    _assert_same("ablate", _load("ablate", tmp_path / "result-ablate"), _single("ablate", _model(), _prompts()))


def _run_alone(out_dir, model=None, prompts=None, **kwargs):
    return _experiment("ablate", model or _model(), out_dir, prompts if prompts is not None else _prompts(), **kwargs)


@pytest.mark.parametrize("change, field", [
    (dict(seed=1), "seed"),
    (dict(model_seed=5), "model_sha256"),
    (dict(task=dict(padding="prefix")), "task.padding"),
    (dict(n_calibration=16), "settings.n_calibration"),
])
def test_mismatched_shards_are_refused_naming_the_field(tmp_path, change, field):
    from dataclasses import replace

    reference = _run_alone(tmp_path / "a")
    model = _model(change.get("model_seed", 0))
    task = replace(_task(), **change["task"]) if "task" in change else _task()
    prompts = task.generate(2, seed=change.get("seed", 0), strict=False)
    kwargs = dict(out_dir=tmp_path / "b", prompts=prompts, chunk_size=CHUNK, progress=False, batch_size=3,
                  seed=change.get("seed", 0), n_calibration=change.get("n_calibration", 8))
    parallel.sharded_ablate(model, task, **kwargs)
    shutil.copy(tmp_path / "b" / "shards" / "chunk-000001.npz", tmp_path / "a" / "shards" / "chunk-000001.npz")
    with pytest.raises(ValueError, match=rf"chunk-000001\.npz does not belong to .*field '{re.escape(field)}'"):
        parallel.merge(tmp_path / "a")
    # a rerun into a directory of another run is refused before any work, naming the field
    kwargs["out_dir"] = tmp_path / "a"
    with pytest.raises(ValueError, match=rf"field '{re.escape(field)}' differs"):
        parallel.sharded_ablate(model, task, **kwargs)
    _assert_same("ablate", reference, _single("ablate", _model(), _prompts()))


def test_profile_of_a_ready_batch_equals_phase_profile(tmp_path):
    model, prompts = _model(), _prompts()
    merged = parallel.sharded_profile(model, prompts, out_dir=tmp_path, chunk_size=5, progress=False)
    _assert_same("profile", merged, phase_profile(model, prompts, progress=False))
    assert len(list((tmp_path / "shards").iterdir())) == 4  # 16 prompts in chunks of 5


def test_merge_refuses_a_foreign_or_broken_directory(tmp_path):
    with pytest.raises(ValueError, match="is an empty folder"):  # the readers' door
        parallel.merge(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not a sharded run directory"):
        parallel.merge(tmp_path)
    _run_alone(tmp_path / "a")
    (tmp_path / "a" / "shards" / "chunk-000002.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match=r"chunk-000002\.npz is not a readable phaseinterp shard"):
        parallel.merge(tmp_path / "a")
    with pytest.raises(ValueError, match=r"chunk_size=0 must be an integer >= 1"):
        parallel.sharded_ablate(_model(), _task(), out_dir=tmp_path / "c", prompts=_prompts(), chunk_size=0)


def test_a_damaged_or_edited_shard_is_named_never_merged(tmp_path):
    """A truncated shard, a stray empty one, a flipped byte and a rewritten array (a valid file whose
    correctness was inverted: it merged into other accuracies, silently) are each one error naming the
    shard; a run description with chunk_size 0 is named too (it divided by zero)."""
    import json

    import numpy as np

    _run_alone(tmp_path / "a")
    shard = tmp_path / "a" / "shards" / "chunk-000001.npz"
    good = shard.read_bytes()
    for damage, says in ((good[:100], "is not a readable phaseinterp shard"), (b"", "is not a readable phaseinterp shard")):
        shard.write_bytes(damage)
        with pytest.raises(ValueError, match=rf"chunk-000001\.npz {says}"):
            parallel.merge(tmp_path / "a")
    with np.load(io.BytesIO(good), allow_pickle=False) as data:
        stored = {name: data[name] for name in data.files}
    key = next(k for k in stored if k.startswith("a/") and stored[k].dtype == bool)
    stored[key] = ~stored[key]
    buffer = io.BytesIO()
    np.savez(buffer, **stored)
    shard.write_bytes(buffer.getvalue())
    with pytest.raises(ValueError, match=r"chunk-000001\.npz was changed after it was written"):
        parallel.merge(tmp_path / "a")
    shard.write_bytes(good)
    parallel.merge(tmp_path / "a")
    run = tmp_path / "a" / "run.json"
    run.write_text(json.dumps({**json.loads(run.read_text()), "chunk_size": 0}))
    with pytest.raises(ValueError, match="chunk_size=0 must be an integer >= 1"):
        parallel.merge(tmp_path / "a")


def test_cli_merge(tmp_path, capsys):
    from phaseinterp.cli import main

    _run_alone(tmp_path / "a")
    assert main(["merge", str(tmp_path / "a"), "--out", str(tmp_path / "merged")]) == 0
    merged = _load("ablate", tmp_path / "merged")
    _assert_same("ablate", merged, _single("ablate", _model(), _prompts()))
    _run_alone(tmp_path / "b", seed=3, prompts=_task().generate(2, seed=3, strict=False))
    shutil.copy(tmp_path / "b" / "shards" / "chunk-000000.npz", tmp_path / "a" / "shards" / "chunk-000000.npz")
    capsys.readouterr()
    assert main(["merge", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert "field 'seed' differs" in err and len(err.strip().splitlines()) == 1


def test_cli_profile_with_shard_dir_resumes_and_equals_phase_profile(tmp_path, capsys):
    from phaseinterp.cli import main

    model, task = _model(), _task()
    model.save_pretrained(tmp_path / "model", metadata={"task": task.to_dict(), "task_type": "KeyValueRetrieval"})
    args = ["profile", str(tmp_path / "model"), "--n-per-residue", "16", "--shard-dir", str(tmp_path / "shards"),
            "--chunk-size", "32", "--query-chunk", "16", "--out", str(tmp_path / "out")]
    assert main(args) == 0
    single = phase_profile(model, task, n_per_residue=16, label=_load("profile", tmp_path / "out").label, progress=False)
    _assert_same("profile", _load("profile", tmp_path / "out"), single)
    shards = sorted((tmp_path / "shards" / "shards").iterdir())
    assert len(shards) == 4  # 128 prompts in chunks of 32
    before = [p.stat().st_mtime_ns for p in shards]
    assert main(args) == 2  # the same --out again: a saved profile is not replaced silently
    assert main(args + ["--overwrite"]) == 0  # every chunk is reused, none recomputed
    assert [p.stat().st_mtime_ns for p in shards] == before
    capsys.readouterr()
    assert main(args + ["--overwrite", "--seed", "1"]) == 2  # another seed into the same shard dir
    assert "field 'seed' differs" in capsys.readouterr().err


def test_cli_under_a_launcher_needs_a_shard_dir(monkeypatch, capsys):
    from phaseinterp.cli import main

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    assert main(["profile", "w4s4"]) == 2
    err = capsys.readouterr().err
    assert "runs in 2 processes: pass --shard-dir DIR" in err and len(err.strip().splitlines()) == 1


def test_launch_info_reads_the_launcher_environment(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert parallel.launch_info() == parallel.Launch(rank=3, world_size=4, local_rank=1)
    monkeypatch.setenv("RANK", "4")
    with pytest.raises(ValueError, match=r"RANK=4 is out of range for WORLD_SIZE=4 \(0\.\.3\)"):
        parallel.launch_info()
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.delenv("RANK")
    assert parallel.launch_info().world_size == 1
    assert parallel.rank_device().type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_sharded_variants_take_every_parameter_of_their_single_process_function():
    """Built from the single-process signature (issue 35): a parameter added there is accepted by the
    sharded variant without a change in parallel/; only the refused ones (each with a reason) differ."""
    import inspect

    from phaseinterp.interventions.ablation import ablate
    from phaseinterp.interventions.gate_cycling import gate_cycling_profile
    from phaseinterp.profile import phase_profile

    pairs = [(phase_profile, parallel.sharded_profile, {"tokenizer", "resume_dir", "retries", "retry_wait"}),
             (ablate, parallel.sharded_ablate, {"calibration_mean"}),
             (gate_cycling_profile, parallel.sharded_gate_cycling_profile, {"baseline"})]
    for single, sharded, refused in pairs:
        ours, theirs = set(inspect.signature(sharded).parameters), set(inspect.signature(single).parameters)
        assert ours == (theirs - refused) | {"out_dir", "chunk_size", "model_sha256", "device", "prompts"}, \
            single.__name__


def test_sharded_refuses_what_it_cannot_shard(tmp_path):
    model, task = _model(), _task()
    with pytest.raises(ValueError, match="baseline= does not apply to a sharded run"):
        parallel.sharded_gate_cycling_profile(model, task, out_dir=tmp_path / "a", baseline=object())
    with pytest.raises(ValueError, match="out_dir= is required"):
        parallel.sharded_ablate(model, task)
    # n_per_residue left out: the single function's default size, not a refusal of None
    sized = parallel.sharded_gate_cycling_profile(model, task, shifts=[1], out_dir=tmp_path / "d", n_boot=5,
                                                  batch_size=64, progress=False)
    assert sized.correct.shape[1] == 72 * task.residue_modulus
