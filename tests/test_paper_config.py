"""The paper's sweep as phaseinterp configs (issue 57, item 4): `pi.paper.config(run)` for every published
controlled run and baseline, refusals by name, and ``phaseinterp pretrain --paper-run``."""

from __future__ import annotations

import json
import re

import pytest
import torch

import phaseinterp as pi
from phaseinterp.cli import main
from phaseinterp.config import CompressedConfig
from phaseinterp.errors import UserInputError
from phaseinterp.models import CompressedTransformer, parameter_count

RUNS = pi.paper.runs()
CONTROLLED = list(RUNS[RUNS.kind == "controlled"].id)
BASELINES = list(RUNS[RUNS.kind == "full attention"].id)
DEEPSEEK = list(RUNS[RUNS.kind == "DeepSeek"].id)
REFUSED = {"kvc_w8s8_1kv_mean_kvshare_postnorm": "post-norm",
           "kvc_w8s4_dsv4kernel_1kv_scalar_rope16": "scalar gates on the DeepSeek kernel"}
EXPRESSIBLE = [r for r in CONTROLLED if r not in REFUSED]


def test_the_manifest_covers_the_published_runs_exactly():
    assert len(CONTROLLED) == 23 and len(BASELINES) == 3 and len(DEEPSEEK) == 5
    assert set(pi.paper.VARIANTS) == set(CONTROLLED) | set(BASELINES)
    table = pi.paper.sweep()
    assert list(table.id) == CONTROLLED + BASELINES
    assert set(table[~table.expressible].id) == set(REFUSED)
    assert (table[table.expressible].refusal == "").all() and (table[~table.expressible].overrides == "").all()


def _meta_model(cfg: CompressedConfig) -> CompressedTransformer:
    with torch.device("meta"):
        return CompressedTransformer(cfg)


@pytest.mark.parametrize("run", EXPRESSIBLE + BASELINES)
def test_every_published_run_is_a_config_at_the_papers_geometry(run):
    row = RUNS.set_index("id").loc[run]
    cfg = pi.paper.config(run)
    assert isinstance(cfg, CompressedConfig)
    # the Qwen3-0.6B backbone: 28 layers (as published), d_model 1024, 16 query heads of 128
    assert cfg.n_layers == int(row.layers) == 28
    assert (cfg.d_model, cfg.n_heads, cfg.d_head, cfg.d_mlp) == (1024, pi.paper.published.QWEN3_QUERY_HEADS, 128, 3072)
    assert cfg.n_kv_heads == int(row.kv_heads)
    if row.kind == "controlled":
        assert cfg.is_compressed and (cfg.window, cfg.stride) == (int(row.W), int(row.S))
    else:
        assert cfg.compression is None
    model = _meta_model(cfg)
    assert next(model.parameters()).device.type == "meta"
    assert len(model.blocks) == 28
    assert model.blocks[0].attn.W_K.shape[0] == int(row.kv_heads)  # the KV heads per layer, in the weights
    assert parameter_count(cfg) > 4e8  # a 0.6B-scale model, not a CPU toy


def test_variants_follow_the_published_names_and_gate_table():
    """The variant of each run as its published name states it, and as the gate table (mode, tied) records
    it for the 9 runs with gate profiles: a wrong override in `VARIANTS` fails here."""
    name = RUNS.set_index("id").name
    for run in EXPRESSIBLE:
        cfg, label = pi.paper.config(run), name[run]
        assert (cfg.positional == "none") == ("no RoPE" in label), run
        assert (cfg.rope_dims == 16) == ("RoPE on 16 dims" in label or "rope16" in run), run
        assert cfg.qk_norm == ("no Q/K norm" not in label), run
        assert cfg.gate_bias == ("no gate bias" not in label), run
        assert (cfg.gate == "uniform") == ("uniform averaging" in label), run
        assert (cfg.memory == "uncompressed_tail") == ("uncompressed tail" in label), run
        assert (cfg.compression == "deepseek") == ("DeepSeek-style kernel" in label), run
        assert cfg.tie_kv_gates == ("tied K/V" in label), run
        seed = re.search(r"seed (\d+)", label)
        assert cfg.seed == (int(seed.group(1)) if seed else 42), run
    gates = pi.paper.table("gates")[["run", "mode", "tied"]].drop_duplicates()
    assert len(gates) == 9
    for run, mode, tied in gates.itertuples(index=False):
        cfg = pi.paper.config(run)
        assert cfg.gate == mode, run
        assert (cfg.tie_kv_gates or cfg.compression == "deepseek") == bool(tied), run  # DeepSeek: one gate for K, V
    # one change from the baseline per variant run (besides the geometry and the seed)
    base = pi.paper.config("kvc_w8s8_1kv_baseline").to_dict()
    for run in ("kvc_w8s8_1kv_nope", "kvc_w8s8_1kv_vector", "kvc_w8s8_1kv_nobias", "kvc_w8s8_1kv_noQKnorm"):
        changed = {k for k, v in pi.paper.config(run).to_dict().items() if base[k] != v}
        assert len(changed) == 1, (run, changed)


@pytest.mark.parametrize("run, why", sorted(REFUSED.items()))
def test_an_inexpressible_variant_is_refused_by_name(run, why):
    name = RUNS.set_index("id").name[run]
    for given in (run, name):
        with pytest.raises(UserInputError, match=re.escape(run)) as info:
            pi.paper.config(given)
        assert why in str(info.value) and "cannot be expressed" in str(info.value)


def test_deepseek_models_and_unknown_runs_are_refused():
    for run in DEEPSEEK + ["DeepSeek-V4-Flash-Base"]:
        with pytest.raises(UserInputError, match="not a controlled pretraining run"):
            pi.paper.config(run)
    with pytest.raises(UserInputError, match="is not a published run; valid: kvc_w8s8_1kv_baseline, ") as info:
        pi.paper.config("kvc_w8s8_16kv")
    assert "full_attn_8kv" in str(info.value)
    with pytest.raises(UserInputError, match="not a published run"):
        pi.paper.config(8)
    assert pi.paper.config("w8/s8 · 1 kv · no rope") == pi.paper.config("kvc_w8s8_1kv_nope")  # names work too


# ------------------------------------------------------------------ the command line
def _plan(capsys, *argv):
    code = main(["pretrain", "--plan", "--seq-len", "256", "--global-batch", "16", "--nproc", "2",
                 "--device-memory", "80", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_pretrain_paper_run_plans_without_data(capsys):
    code, out, err = _plan(capsys, "--paper-run", "kvc_w8s8_1kv_baseline")
    assert code == 0, err
    assert "plan: W8/S8 gated, paper run kvc_w8s8_1kv_baseline" in out and "per device:" in out
    assert "lr 0.0003, warm-up 380 steps" in out  # the qwen3-0.6b recipe
    code, out, err = _plan(capsys, "--paper-run", "W8/S4 · 1 KV · DeepSeek-style kernel")
    assert code == 0, err
    assert "W8/S4 deepseek, paper run kvc_w8s4_dsv4kernel_1kv_rope16" in out
    code, out, err = _plan(capsys, "--paper-run", "full_attn_4kv")
    assert code == 0 and "full attention, paper run full_attn_4kv" in out, err


def test_pretrain_paper_run_settings_are_the_published_config():
    """The CLI's architecture is `pi.paper.config(run)` (d_vocab aside, set by a tokenizer) and its seed
    the run's seed unless --seed says otherwise."""
    from phaseinterp.cli.args import build_parser
    from phaseinterp.cli.commands import _pretrain_settings

    parser = build_parser()
    for run in ("kvc_w8s8_1kv_baseline_seed44", "kvc_w8s8_1kv_nope", "full_attn_1kv"):
        config, tc = _pretrain_settings(parser.parse_args(["pretrain", "--paper-run", run, "--plan"]))
        assert config == pi.paper.config(run)
        assert tc.seed == pi.paper.config(run).seed
    config, tc = _pretrain_settings(parser.parse_args(["pretrain", "--paper-run", "kvc_w8s8_1kv_baseline_seed44",
                                                       "--plan", "--seed", "7"]))
    assert tc.seed == config.seed == 7 and config.replace(seed=44) == pi.paper.config("kvc_w8s8_1kv_baseline_seed44")


@pytest.mark.parametrize("extra, flag", [(["--preset", "qwen3-0.6b"], "--preset"),
                                         (["--set", "stride=4"], "--set"),
                                         (["--config", "MODEL"], "--config")])
def test_paper_run_beside_another_architecture_is_refused(capsys, tmp_path, extra, flag):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"model": {"window": 4}}))
    code, out, err = _plan(capsys, "--paper-run", "kvc_w8s8_1kv_baseline",
                           *[str(path) if e == "MODEL" else e for e in extra])
    assert code == 2 and f"--paper-run and {flag}" in err and "both name the architecture" in err, err


def test_paper_run_with_a_train_only_config_and_refusals_by_name(capsys, tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"train": {"lr": 1e-4}}))
    code, out, err = _plan(capsys, "--paper-run", "kvc_w8s8_1kv_baseline", "--config", str(path))
    assert code == 0 and "lr 0.0001" in out, err
    code, out, err = _plan(capsys, "--paper-run", "kvc_w8s4_dsv4kernel_1kv_scalar_rope16")
    assert code == 2 and "kvc_w8s4_dsv4kernel_1kv_scalar_rope16" in err and "cannot be expressed" in err
    code, out, err = _plan(capsys, "--paper-run", "nope")
    assert code == 2 and "not a published run" in err and "kvc_w8s8_1kv_baseline" in err
    code, out, err = _plan(capsys, "--paper-run", "flash_base")
    assert code == 2 and "not a controlled pretraining run" in err
    code, out, err = _plan(capsys)
    assert code == 2 and "--preset NAME or --paper-run RUN" in err


def test_prepare_records_the_paper_run(tmp_path):
    """pretrain.json names the published run, so the evaluation knows which profile to compare with."""
    from phaseinterp.train.pretrain import RUN_FILE, PretrainConfig, prepare
    from phaseinterp.train.tokenizer import train_tokenizer

    from pydoc_data.topics import topics  # English text on every Python

    corpus = tmp_path / "corpus.jsonl"
    paragraphs = [p for k in sorted(topics)[:60] for p in topics[k].split("\n\n") if len(p) > 80]
    corpus.write_text("".join(json.dumps({"text": p}) + "\n" for p in paragraphs))
    tok = train_tokenizer(corpus, 1024, tmp_path / "tok", progress=False)
    tc = PretrainConfig(seq_len=64, global_batch=2, steps=1)
    config = pi.paper.config("kvc_w4s4_1kv").replace(d_vocab=1024, n_ctx=64, n_layers=1, d_model=32, n_heads=2,
                                                       d_head=16, d_mlp=32)
    record = prepare(config, corpus, tok, tc, tmp_path / "run", progress=False, paper_run="kvc_w4s4_1kv")
    assert record["paper_run"] == "kvc_w4s4_1kv"
    assert json.loads((tmp_path / "run" / RUN_FILE).read_text())["paper_run"] == "kvc_w4s4_1kv"
    plain = prepare(config, corpus, tok, tc, tmp_path / "plain", progress=False)
    assert "paper_run" not in plain


def test_profile_of_a_paper_run_defaults_to_its_published_run(tmp_path, capsys):
    """``profile RUN_DIR`` of a run pretrained with --paper-run compares with that published run unless
    --paper says otherwise; other folders are left alone."""
    from argparse import Namespace

    from phaseinterp.cli import paper_run
    from phaseinterp.paper.sweep import BACKBONE
    from phaseinterp.train.pretrain import RUN_FILE

    assert paper_run.RUN_FILE == RUN_FILE and paper_run.BACKBONE == BACKBONE
    (tmp_path / RUN_FILE).write_text(json.dumps({"model": {}, "paper_run": "kvc_w8s8_1kv_nope"}))
    args = Namespace(model=str(tmp_path), paper=None, engine=None)
    assert paper_run.default_paper_run(args) == "kvc_w8s8_1kv_nope" and args.paper == "kvc_w8s8_1kv_nope"
    assert "--paper kvc_w8s8_1kv_nope" in capsys.readouterr().err
    chosen = Namespace(model=str(tmp_path), paper="kvc_w8s4", engine=None)
    assert paper_run.default_paper_run(chosen) is None and chosen.paper == "kvc_w8s4"
    (tmp_path / RUN_FILE).write_text(json.dumps({"model": {}}))
    plain = Namespace(model=str(tmp_path), paper=None, engine=None)
    assert paper_run.default_paper_run(plain) is None and plain.paper is None
    assert paper_run.default_paper_run(Namespace(model=str(tmp_path / "none"), paper=None, engine=None)) is None
