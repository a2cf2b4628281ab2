"""Issue 24: the phase-resolved conformance check catches boundary faults at exactly the phases
they break, passes correct implementations, and reads an OpenAI-compatible server."""

import http.server
import json
import re
import threading
import types

import numpy as np
import pytest
import torch

import phaseinterp as pi
from phaseinterp import engines
from phaseinterp.engines import CacheEngine, ConformanceResult, OpenAIEngine, chunked_pieces, conformance


def tiny_task():
    """32-token prompts (4 residues, 4 records, 19 fillers, the target beyond the 16-token local
    window): the log-prob comparisons do not need the model's own 128-token task, and decoding
    32 tokens keeps the tests short."""
    from phaseinterp.tasks import KeyValueRetrieval

    return KeyValueRetrieval(seq_len=32, n_records=4, n_demos=1, min_distance=17, residue_modulus=4)


@pytest.fixture(scope="module")
def w4s4():
    return pi.zoo.load("w4s4"), tiny_task()


# --------------------------------------------------------------------------- faulty engines
class LateCloseDecode(CacheEngine):
    """Token-by-token decoding whose last layer sees each window's entry one token late: at the
    query that closes a window (phase S-1) the newest entry is masked out."""

    def __init__(self, model):
        super().__init__(model, engines.decode_pieces, "late_close")

    @torch.inference_mode()
    def __call__(self, tokens):
        model, S = self.model, self.model.cfg.stride
        name = f"blocks.{model.cfg.n_layers - 1}.attn.hook_attn_scores"
        cache, logits, closes = model.init_cache(), None, [False]

        def hide_newest(scores, hook):
            if not closes[0]:
                return scores
            scores = scores.clone()
            scores[..., -1] = float("-inf")  # the entry closed by this very token
            return scores

        with model.hooks(fwd_hooks=[(name, hide_newest)]):
            for t in range(tokens.shape[1]):
                closes[0] = t % S == S - 1 and t >= model.cfg.window - 1
                logits = model(tokens[:, t:t + 1], cache=cache)
        return torch.log_softmax(logits[:, -1].float(), dim=-1)


def drop_open_entry_at_cuts(model, monkeypatch):
    """Patch every layer's cache extension: after a multi-token piece that ends inside a window,
    the compressor inputs of that open window are lost (zeroed), as a prefill kernel that keeps
    only closed windows would do. Decoding (one-token pieces) is untouched."""
    S = model.cfg.stride
    for block in model.blocks:
        original = block.attn._extend

        def faulty(self, cache, x, k, v, k_rot, start, original=original):
            grown = original(cache, x, k, v, k_rot, start)
            end = start + x.shape[1]
            if x.shape[1] > 1 and end % S:
                grown.h = grown.h.clone()
                grown.h[:, end - end % S:end] = 0.0
            return grown

        monkeypatch.setattr(block.attn, "_extend", types.MethodType(faulty, block.attn))


# ---------------------------------------------------------------------------------- tests
def test_late_window_close_is_flagged_at_the_boundary_phase_only(w4s4):
    model, task = w4s4
    result = conformance(model, task, ("decode",), n_per_residue=2, engines={"late_close": LateCloseDecode(model)})
    S = model.cfg.stride
    assert result.failing_phases("decode") == ()  # the real cache agrees at every phase
    assert result.failing_phases("late_close") == (S - 1,)
    rows = result.table[(result.table["setting"] == "late_close")]
    assert (rows.loc[rows["phase"] != S - 1, "max_abs_diff"] < 1e-3).all()


def test_open_entry_dropped_at_a_cut_is_flagged_at_nonzero_cut_phases_only(w4s4, monkeypatch):
    model, task = w4s4
    drop_open_entry_at_cuts(model, monkeypatch)
    result = conformance(model, task, ("decode", "chunked_prefill"), n_per_residue=2, chunk=8)
    assert result.failing_phases("decode") == ()  # one-token pieces never leave an open window behind
    assert result.failing_phases("chunked_prefill", "cut") == (1, 2, 3)
    monkeypatch.undo()
    clean = conformance(model, task, ("chunked_prefill",), n_per_residue=2, chunk=8)
    assert clean.passed and clean.failing_phases("chunked_prefill", "cut") == ()


def test_chunked_pieces_cut_every_piece_at_one_phase():
    for length in (125, 126, 127, 128):
        for period, chunk in ((4, 32), (32, 32), (2, 6)):
            for c in range(period):
                pieces = chunked_pieces(length, c, period, chunk)
                assert sum(pieces) == length
                starts = np.cumsum([0] + pieces[:-1])[1:]
                assert all(s % period == c for s in starts if s < length - sum(p == 1 for p in pieces[-period:]))
                n_decode = length - (length - 1 - ((length - 1 - c) % period))
                assert 1 <= n_decode <= period and pieces[-n_decode:] == [1] * n_decode
                prefill_cuts = np.cumsum(pieces[:len(pieces) - n_decode])
                assert all(cut % period == c for cut in prefill_cuts)
    with pytest.raises(ValueError, match="multiple of the cut period"):
        chunked_pieces(128, 1, 4, 6)


def test_result_protocol_roundtrip(w4s4, tmp_path):
    model, task = w4s4
    result = conformance(model, task, ("decode", "dtype"), dtypes=("bfloat16",), n_per_residue=1,
                         answer_phases=(0, 3))
    assert set(result.table["phase"]) == {0, 3}
    assert set(result.records["answer_pos"] % model.cfg.stride) == {0, 3}
    assert result.failing_phases("decode") == ()
    loaded = ConformanceResult.load(result.save(tmp_path / "c"))
    assert loaded == result
    assert "decode: failing answer phases" in repr(result)
    fig = result.plot()
    assert len(fig.data) == 1 and fig.data[0].z.shape == (2, 2)  # settings x answer phases
    assert result.verdicts().loc["decode"].eq("pass").all()


def test_answer_phase_variants_delete_fillers_only(w4s4):
    model, task = w4s4
    batch = task.generate(1, seed=0, strict=False)
    variants = engines.check.answer_phase_variants(batch.tokens, task.vocab.filler_ids, 4, range(4))
    fillers = torch.tensor(task.vocab.filler_ids)
    for a, (tokens, _removed) in variants.items():
        assert (tokens.shape[1] - 1) % 4 == a
        for row in range(len(tokens)):
            kept = batch.tokens[row][~torch.isin(batch.tokens[row], fillers)]
            assert torch.equal(tokens[row][~torch.isin(tokens[row], fillers)], kept)  # only fillers went


@pytest.mark.parametrize("kwargs, match", [
    (dict(modes=("decode", "prefill")), "mode 'prefill' is not one of"),
    (dict(modes=()), "nothing to check"),
    (dict(answer_phases=(4,)), r"answer_phases=4 is out of range \(valid: 0..3\)"),
    (dict(cut_phases=(0, 0)), "repeats a phase"),
    (dict(chunk=6), "chunk=6 must be a multiple of the cut period 4"),
    (dict(modes=("dtype",), dtypes=("float8",)), "dtype 'float8' is not one of"),
    (dict(tolerance={"nope": 1.0}), "not a setting of this check"),
    (dict(tolerance={"decode": -1.0}), "must be > 0"),
    (dict(tolerance={"decode": ("median", 1.0)}), "statistic 'median'"),
    (dict(n_per_residue=0), "n_per_residue=0 must be an integer >= 1"),
    (dict(engines={"decode": lambda t: t}), "engine name 'decode'"),
])
def test_bad_input_is_refused_before_any_work(w4s4, kwargs, match):
    model, task = w4s4
    modes = kwargs.pop("modes", ("decode",))
    with pytest.raises(ValueError, match=match):
        conformance(model, task, modes, **kwargs)


def test_cli_conformance_and_its_bad_input(tmp_path, capsys):
    from phaseinterp.cli import main

    args = ["conformance", "w4s4", "--modes", "dtype", "--dtypes", "bfloat16", "--n-per-residue", "1"]
    assert main(args + ["--out", str(tmp_path / "c")]) == 0
    loaded = ConformanceResult.load(tmp_path / "c")
    assert loaded.settings == ("bfloat16",) and loaded.n_prompts == 24 and loaded.failing_phases("bfloat16") == ()
    assert main(["conformance", "w4s4", "--chunk", "6"]) == 2
    assert "chunk=6 must be a multiple of the cut period 4" in capsys.readouterr().err


# ------------------------------------------------------------- warm: a reused prefix cache
def keep_only_closed_windows_on_truncation(monkeypatch):
    """A prefix cache that keeps the compressor inputs of closed windows only: the tokens of the
    window still open at the shared-prefix length come back zeroed (its entry is then compressed
    from zeros once the target closes it). A prefix ending on a window start loses nothing."""
    original = engines.adapters.truncate_cache

    def faulty(model, cache, length):
        kept = original(model, cache, length)
        for layer in kept.layers:
            layer.h = layer.h.clone()
            layer.h[:, length - length % model.cfg.stride:] = 0.0
        return kept

    monkeypatch.setattr(engines.adapters, "truncate_cache", faulty)


def test_warm_prefix_cache_answers_as_cold_at_every_prefix_phase(w4s4):
    model, task = w4s4
    result = conformance(model, task, ("warm",), n_per_residue=2, progress=False)
    assert result.passed and result.settings == ("warm",)
    assert sorted(set(result.records["prefix_len"])) == [12, 13, 14, 15]  # default: one length per phase mod 4
    assert result.failing_phases("warm", "cut") == () and sorted(result.table.query("kind == 'cut'").phase) == [0, 1, 2, 3]
    assert (result.records["max_abs_diff"] < 1e-4).all() and result.records["agree"].all()
    donors = engines.check.donor_prompts(result_tokens := task.generate(2, seed=0, strict=False).tokens, 13,
                                         task.vocab.filler_ids)
    assert torch.equal(donors[:, :13], result_tokens[:, :13]) and (donors[:, 13] != result_tokens[:, 13]).all()


def test_warm_cache_that_loses_the_open_window_fails_at_nonzero_prefix_phases(w4s4, monkeypatch):
    model, task = w4s4
    keep_only_closed_windows_on_truncation(monkeypatch)
    result = conformance(model, task, ("warm",), n_per_residue=2, prefix_lengths=(16, 17, 18, 19, 20), progress=False)
    assert result.failing_phases("warm", "cut") == (1, 2, 3)
    cut0 = result.table.query("kind == 'cut' and phase == 0").iloc[0]
    assert cut0["max_abs_diff"] < 1e-4 and cut0["n"] == 2 * 4 * 8  # lengths 16 and 20 x 4 answer phases x 8 prompts


def test_deepseek_v4_warm_checkpoint_at_csa_phases_and_the_hca_boundary():
    """transformers' DeepSeek-V4 cache checkpointed after the shared prefix (`TransformersEngine.warm`):
    the same answers as the full forward with the prefix ending at every CSA phase (mod 4) and on and
    around an HCA boundary (32)."""
    from phaseinterp.tasks import KeyValueRetrieval

    model = pi.zoo.load("dsv4-tiny")
    task = KeyValueRetrieval(seq_len=40, n_records=6, n_demos=1, min_distance=18, residue_modulus=4)
    result = conformance(model, task, ("warm",), n_per_residue=1, answer_phases=(3,),
                         prefix_lengths=(29, 30, 31, 32, 33, 34), progress=False)
    assert result.cut_period == 32 and sorted(set(result.records["prefix_len"] % 4)) == [0, 1, 2, 3]
    assert result.passed, result.table[["kind", "phase", "max_abs_diff"]]


class ColdOnly:
    """An engine without a prefix cache (no ``warm``)."""

    name = "cold_only"

    def __call__(self, tokens):
        return torch.zeros(tokens.shape[0], 4)


@pytest.mark.parametrize("kwargs, match", [
    (dict(warm_engines={"plain": ColdOnly()}), "warm_engines['plain']: a ColdOnly cannot reuse a cached prefix"),
    (dict(prefix_lengths=(0,)), "prefix_lengths=0 is out of range (valid: 1..28) (shared-prefix lengths for the "
                                "shortest prompt of 29 tokens)"),
    (dict(prefix_lengths=(12, 29)), "prefix_lengths=29 is out of range (valid: 1..28)"),
    (dict(prefix_lengths=(1.5,)), "prefix_lengths=1.5 must be an integer in 1..28"),
    (dict(prefix_lengths=(12, 12)), "repeats a length"),
    (dict(modes=("decode",), prefix_lengths=(12,)), "prefix_lengths=(12,) is for the warm mode"),
    (dict(engines={"x": ColdOnly()}, warm_engines={"x": CacheEngine.__new__(CacheEngine)}), "in both engines and"),
    (dict(warm_engines=[1]), "warm_engines=list must be a dict"),
    (dict(reference=5), "reference is a int, not a callable engine"),
])
def test_warm_bad_input_is_one_clear_line(w4s4, kwargs, match):
    from phaseinterp.errors import UserInputError

    import inspect

    from phaseinterp._checks import experiment
    model, task = w4s4
    modes = kwargs.pop("modes", ("warm",))
    # as a user calls it: without the suite's type hook (on the body, inside `experiment`), which stops some first
    check = experiment(conformance.__spec_type__)(inspect.unwrap(conformance))
    with pytest.raises(UserInputError, match=re.escape(match)) as caught:
        check(model, task, modes, n_per_residue=1, progress=False, **kwargs)
    assert "\n" not in str(caught.value)


def test_check_warm_rows_names_the_problem():
    from phaseinterp.engines.adapters import check_warm_rows
    from phaseinterp.errors import UserInputError

    tokens = torch.arange(12).reshape(2, 6)
    with pytest.raises(UserInputError, match=re.escape("prefix_len=6 is out of range (valid: 1..5) (prompts of 6 tokens)")):
        check_warm_rows(tokens, tokens, 6)
    with pytest.raises(UserInputError, match="differ within the first prefix_len=3"):
        check_warm_rows(tokens.flip(1), tokens, 3)
    with pytest.raises(UserInputError, match="must be one"):
        check_warm_rows(tokens[:, :5], tokens, 3)


# ------------------------------------------------------------- OpenAI-compatible stand-in
def _serve(model, perturb_phase=None, corrupt_reused_prefix=False):
    """A local /v1/completions server answering from ``model``'s full forward (top-20 logprobs,
    keys "token_id:N"); ``perturb_phase`` swaps the top two tokens when the last position has that phase.
    ``corrupt_reused_prefix``: a faulty prefix cache; a prompt that shares with the same row of the
    previous request a prefix ending inside a window (length mod S != 0) is answered with its top two
    tokens swapped."""
    S = model.cfg.stride
    previous: list = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - the stdlib's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            assert self.path == "/v1/completions" and body["max_tokens"] == 1
            tokens = torch.tensor(body["prompt"])
            with torch.inference_mode():
                logprobs = torch.log_softmax(model(tokens)[:, -1].float(), -1)
            choices = []
            for i, row in enumerate(logprobs):
                top = row.topk(body["logprobs"])
                values, ids = top.values.tolist(), top.indices.tolist()
                if perturb_phase is not None and (tokens.shape[1] - 1) % S == perturb_phase:
                    values[0], values[1] = values[1], values[0]
                if corrupt_reused_prefix and i < len(previous):
                    shared = 0
                    while shared < min(len(previous[i]), tokens.shape[1]) and previous[i][shared] == tokens[i, shared]:
                        shared += 1
                    if 0 < shared < tokens.shape[1] and shared % S:
                        values[0], values[1] = values[1], values[0]
                entries = {f"token_id:{t}": v for t, v in zip(ids, values)}
                choices.append({"index": i, "text": "", "logprobs": {"top_logprobs": [entries]}})
            previous[:] = body["prompt"]
            payload = json.dumps({"choices": choices}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.parametrize("perturb_phase", [None, 2])
def test_openai_compatible_server_adapter(w4s4, perturb_phase):
    model, task = w4s4
    server = _serve(model, perturb_phase)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        engine = OpenAIEngine(url, "w4s4", d_vocab=model.cfg.d_vocab, top_logprobs=20)
        result = conformance(model, task, (), n_per_residue=1, engines={"server": engine})
    finally:
        server.shutdown()
    assert (result.records["n_reported"] == 20).all()
    expected = () if perturb_phase is None else (perturb_phase,)
    assert result.failing_phases("server") == expected
    if perturb_phase is not None:
        row = result.table[(result.table["phase"] == perturb_phase) & (result.table["kind"] == "answer")].iloc[0]
        assert row["agreement"] == 0.0  # every top-1 swapped


@pytest.mark.parametrize("corrupt", [False, True])
def test_openai_server_warm_answers_checked_per_prefix_phase(w4s4, corrupt):
    """`OpenAIEngine.warm`: the donors in one request, then the prompts; a server whose prefix cache
    spoils a reused prefix ending mid-window fails at exactly those prefix phases."""
    model, task = w4s4
    server = _serve(model, corrupt_reused_prefix=corrupt)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        engine = OpenAIEngine(url, "w4s4", d_vocab=model.cfg.d_vocab, top_logprobs=20)
        result = conformance(model, task, (), n_per_residue=1, answer_phases=(0, 3), warm_engines={"server": engine},
                             progress=False)
    finally:
        server.shutdown()
    assert result.settings == ("server",) and set(result.records["mode"]) == {"warm"}
    assert result.failing_phases("server", "cut") == ((1, 2, 3) if corrupt else ())
    cut = result.table[result.table["kind"] == "cut"].set_index("phase")
    assert cut.loc[0, "agreement"] == 1.0
    if corrupt:
        assert (cut.loc[[1, 2, 3], "agreement"] == 0.0).all()  # every reused mid-window prefix swapped the top-1
        assert "server: failing cut phases" in repr(result)


def test_openai_engine_refuses_bad_settings():
    with pytest.raises(ValueError, match="must start with http"):
        OpenAIEngine("localhost:8000", "m", d_vocab=10)
    with pytest.raises(ValueError, match="d_vocab=0"):
        OpenAIEngine("http://localhost:8000", "m", d_vocab=0)


def test_deepseek_v4_through_transformers_cache():
    model = pi.zoo.load("dsv4-tiny")
    from phaseinterp.tasks import KeyValueRetrieval

    task = KeyValueRetrieval(seq_len=40, n_records=6, n_demos=1, min_distance=18, residue_modulus=4)
    result = conformance(model, task, ("chunked_prefill",), n_per_residue=1, answer_phases=(3,),
                         cut_phases=(0, 1, 31))
    assert result.cut_period == 32  # lcm of the CSA rate 4 and the HCA rate 32
    assert result.failing_phases("chunked_prefill", "cut") == ()


@pytest.mark.parametrize("bad, match", [
    (dict(modes=None), "modes=None"),  # was TypeError: 'NoneType' object is not iterable
    (dict(modes=3), "modes=3"),
    (dict(dtypes=None), "dtypes=None"),
    (dict(tolerance=[1]), "tolerance=[1]"),
    (dict(engines=[1]), "engines=list"),
    (dict(n_bootstrap=10**12), "n_bootstrap"),  # was accepted: a bootstrap without end
])
def test_conformance_refuses_bad_arguments_before_work(bad, match):
    """What the fuzzer (tests/test_fuzz_inputs.py, issue 37) found: each a UserInputError naming the argument."""
    import inspect

    from phaseinterp._checks import experiment
    from phaseinterp.errors import UserInputError
    from phaseinterp.tasks import KeyValueRetrieval

    # as a user calls it: without the suite's type hook (on the body, inside `experiment`), which stops some first
    check = experiment(conformance.__spec_type__)(inspect.unwrap(conformance))
    task = KeyValueRetrieval(seq_len=64, n_records=8, n_demos=2, min_distance=20, residue_modulus=8)
    model = pi.CompressedTransformer(pi.CompressedConfig(d_vocab=task.vocab.size, n_ctx=64, d_model=32, n_layers=1,
                                                   n_heads=2, n_kv_heads=1, d_head=16, d_mlp=64, window=4, stride=4,
                                                   local_window=8)).eval()
    with pytest.raises(UserInputError, match=re.escape(match)):
        check(model, task, **{"modes": ("decode",), "n_per_residue": 2, "progress": False, **bad})
