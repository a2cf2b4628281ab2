"""DeepSeek-V4 at long prompts: the chunked attention (`HookedDeepseekV4.set_query_chunk`) equals
transformers' eager forward at every position, ties in the indexer's top-k break as transformers
breaks them, hooks keep their meaning per chunk, and knockouts run through the chunked path."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")
from dsv4_random import randomized  # noqa: E402
from transformers import DeepseekV4Config  # noqa: E402

from phaseinterp.errors import UserInputError  # noqa: E402
from phaseinterp.models.hf import from_hf  # noqa: E402
from phaseinterp.models.hf.against_hf import check_against_transformers  # noqa: E402
from phaseinterp.models.hf.chunking import (AUTO_CHUNK_ABOVE, LONG_SCORE_BLOCK, SCORE_BLOCK,  # noqa: E402
                                            chunk_ranges, chunk_size, is_chunked)

CSA, HCA, SLIDING = "compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"


def published_attention(vocab: int = 64, **kw) -> DeepseekV4Config:
    """A small-width random V4 with the published attention settings: sliding window 128, CSA rate 4,
    HCA rate 128, index top-k 512, hc_mult 4 (narrow everything else so CPU runs long prompts)."""
    base = dict(
        vocab_size=vocab, hidden_size=32, moe_intermediate_size=16, num_hidden_layers=3, num_attention_heads=2,
        head_dim=16, q_lora_rank=16, n_routed_experts=2, num_experts_per_tok=1, n_shared_experts=1,
        layer_types=[CSA, HCA, SLIDING], compress_rates={CSA: 4, HCA: 128}, hc_mult=4, hc_sinkhorn_iters=3,
        mlp_layer_types=["hash_moe", "moe", "moe"], sliding_window=128, o_groups=2, o_lora_rank=16,
        index_n_heads=2, index_head_dim=8, index_topk=512, partial_rotary_factor=0.5,
        max_position_embeddings=1 << 20, attn_implementation="eager", bos_token_id=None, eos_token_id=None,
    )
    return DeepseekV4Config(**{**base, **kw})


def tokens_of(vocab: int, T: int, batch: int = 1, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, T), generator=torch.Generator().manual_seed(seed))


def assert_equal_to_eager(hf, model, tokens, chunks=(1, 7, 64), atol=1e-4):
    """Under every chunk setting: transformers' eager logits with its indexer selection in place (the
    selections the same up to exact ties, `check_against_transformers`), and the same logits as the
    unchunked forward with phaseinterp's own selection (ties break alike in every layout)."""
    assert hf is model.hf
    with torch.no_grad():
        model.set_query_chunk(None)
        whole = model(tokens)
        for chunk in chunks:
            model.set_query_chunk(chunk)
            try:
                check = check_against_transformers(model, tokens)
                out = model(tokens)
            finally:
                model.set_query_chunk("auto")
            assert check.ok, f"query_chunk={chunk}: {check}"
            assert check.max_abs_diff <= atol, f"query_chunk={chunk}, T={tokens.shape[1]}: {check}"
            diff = (out - whole).abs().max().item()
            assert diff <= atol, f"query_chunk={chunk} vs None, T={tokens.shape[1]}: max |logit diff| {diff:.2e}"


@pytest.fixture(scope="module")
def small():
    hf = randomized(published_attention(index_topk=6, sliding_window=8, compress_rates={CSA: 4, HCA: 16}))
    return hf, from_hf(hf)


# --------------------------------------------------------------------- numerics
@pytest.mark.parametrize("T", [1, 3, 4, 5, 9, 15, 16, 17, 31, 47, 70])
def test_chunked_equals_eager_at_every_position_short(small, T):
    """Shorter than one CSA entry, than the window, than one HCA entry, and past the top-k: every
    position's logits (every phase of both rates) equal transformers' eager forward."""
    hf, model = small
    assert_equal_to_eager(hf, model, tokens_of(64, T, batch=2, seed=T), chunks=(1, 7, 64) if T <= 17 else (7, 64))


@pytest.mark.parametrize("name", ["dsv4-tiny", "dsv4.1-tiny"])
def test_chunked_equals_eager_on_the_trained_tiny_models(name):
    from phaseinterp import zoo

    if name not in zoo.available():
        pytest.skip(f"{name} is not shipped")
    model = zoo.load(name)
    T = model.cfg.n_ctx
    assert_equal_to_eager(model.hf, model, tokens_of(model.cfg.d_vocab, T, batch=2), chunks=(16, 100))


@pytest.mark.slow
def test_chunked_equals_eager_with_the_published_attention_settings():
    """Window 128, rates 4 and 128, top-k 512, at 2,300 tokens (575 CSA entries: the top-k selects
    from position 2,051 on; 17 HCA entries): every position, so every phase of both rates."""
    hf = randomized(published_attention())
    model = from_hf(hf)
    assert_equal_to_eager(hf, model, tokens_of(64, 2300), chunks=(256, 1000))


def test_top_k_ties_go_to_the_lowest_entries_in_every_layout(small):
    """With the indexer's query projection at zero every closed entry scores exactly 0.0: each row's
    top-k is a choice among ties. phaseinterp gives them to the lowest entry indices, the same in a
    full forward under every chunk setting and in a prefill followed by steps; transformers' choice
    (``torch.topk``'s) is the same set of scores (a tie set), and with its choice in place the logits
    are transformers'."""
    hf, model = small
    comp = model.blocks[0].attn.compressor
    tokens = tokens_of(64, 90, batch=2, seed=3)
    name = "blocks.0.attn.compressor.indexer.hook_selected"
    k = hf.config.index_topk
    saved = comp.indexer.hf.q_b_proj.weight.detach().clone()

    def selections(calls):
        seen = []
        with model.hooks(fwd_hooks=[(name, lambda t, hook: seen.append(t.clone()))]):
            calls()
        return seen

    try:
        with torch.no_grad():
            comp.indexer.hf.q_b_proj.weight.zero_()
            for chunk in (1, 5, 90):
                model.set_query_chunk(chunk)
                (chosen,) = selections(lambda: model(tokens))
                closed = (torch.arange(90) + 1) // 4
                want = torch.arange(chosen.shape[-1]).expand(90, -1)
                want = torch.where(want < closed[:, None], want, -1)  # the lowest entries, -1 where none
                assert torch.equal(chosen, want.expand(2, -1, -1)), chunk
            model.set_query_chunk("auto")
            cache = model.init_cache()
            steps = selections(lambda: [model(tokens[:, a:b], cache=cache) for a, b in ((0, 50), (50, 51), (51, 90))])
            assert chosen.shape[-1] == k
            for (a, b), s in zip(((0, 50), (50, 51), (51, 90)), steps):  # k = index_topk in each call
                assert torch.equal(s, chosen[:, a:b]), (a, b)
            check = check_against_transformers(model, tokens)
            assert check.ok and check.rows_tied_apart > 0, check  # the ties are real, and only ties differ
            assert check.max_abs_diff <= 1e-4, check
    finally:
        with torch.no_grad():
            comp.indexer.hf.q_b_proj.weight.copy_(saved)
        model.set_query_chunk("auto")


def reference_top_k(row: torch.Tensor, k: int) -> list[int]:
    """The tie rule spelled out: the k highest scores, ties at the k-th going to the lowest indices."""
    order = sorted(range(len(row)), key=lambda j: (-float(row[j]), j))
    return sorted(order[:k])


def test_top_k_set_keeps_the_k_highest_and_gives_ties_to_the_lowest_entries():
    """`top_k_set` on rows where many scores tie at 0.0 (the indexer's ReLU zeros), some at the k-th
    place and some not, with negative scores, -inf tails (entries not closed yet) and rows with fewer
    than k finite scores: the reference rule's entries, ascending, and the same entries when the row
    is longer by -inf columns (the closed-columns-only layout of the unhooked forward)."""
    from phaseinterp.models.hf.compressor import top_k_set

    g = torch.Generator().manual_seed(0)
    k, n = 6, 40
    rows = torch.randn(64, n, generator=g)
    rows[rows.abs() < 0.8] = 0.0  # about half the row exactly 0.0
    rows[::4, :] = rows[::4, :].clamp(max=0.0)  # at most ties above: the k-th place is a 0.0 tie
    rows[1::8, 30:] = float("-inf")  # not closed yet
    rows[3::8, 4:] = float("-inf")  # fewer than k finite scores
    rows[5] = 0.0  # every score tied
    top = top_k_set(rows, k)
    for r in range(rows.shape[0]):
        assert top[r].tolist() == reference_top_k(rows[r], k), r
    tied_at_kth = sum(int((rows[r] == rows[r].topk(k).values[-1]).sum() > 1) for r in range(rows.shape[0]))
    assert tied_at_kth >= 16  # the tie path runs on many rows
    wider = torch.cat([rows, torch.full((64, 25), float("-inf"))], dim=-1)
    assert torch.equal(top_k_set(wider, k), top)
    assert torch.equal(top_k_set(rows.view(8, 8, n), k), top.view(8, 8, k))  # leading dims are rows
    assert torch.equal(top_k_set(rows[:, :k], k), torch.arange(k).expand(64, -1))
    nan = rows.clone()
    nan[7, :] = float("nan")  # a hook's NaN: topk's own choice, still k ascending indices
    out = top_k_set(nan, k)
    assert torch.equal(out[:7], top[:7]) and torch.equal(out[8:], top[8:])
    assert out[7].tolist() == sorted(out[7].tolist()) and len(set(out[7].tolist())) == k


def test_index_scores_are_transformers_scorer_to_float32_rounding(small):
    """`index_scores` batches the score matmul as one [chunk * head, d] x [d, entry] product per prompt
    row (transformers broadcasts the entries to a batch per query): the same formula, the scores within
    the float32 rounding bound of two length-d dot products summed in other orders. BLAS picks its kernel
    by shape, so bit equality is not a property of either code: on an AVX2 CPU transformers' own scorer
    changes bits when its entries are narrowed (RESULTS), so no chunked scorer can promise it."""
    from phaseinterp.models.hf.compressor import index_scores

    hf, model = small
    scorer = model.blocks[0].attn.compressor.indexer.hf.scorer
    g = torch.Generator().manual_seed(1)
    heads, d = hf.config.index_n_heads, hf.config.index_head_dim
    u = 2.0 ** -24  # float32's unit round-off
    gamma = d * u / (1 - d * u)  # a length-d dot product in any summation order (Higham, 3.1)
    for batch, C, E in ((1, 37, 700), (3, 5, 64)):
        q, entries = torch.randn(batch, C, heads, d, generator=g), torch.randn(batch, E, d, generator=g)
        x = torch.randn(batch, C, hf.config.hidden_size, generator=g)
        with torch.no_grad():
            want = scorer(q, entries, x)
            got = index_scores(scorer, q, entries, x)
            weights = scorer.weights_proj(x).double().abs() * abs(scorer.weights_scaling)  # [batch, C, head]
        magnitude = torch.einsum("bchd,bed->bche", q.double().abs(), entries.double().abs())
        scale = abs(scorer.softmax_scale)
        # each side's dot products err by <= gamma |q||k|; the scale, weight and head-sum steps add (heads + 2) u
        bound = ((2 * gamma + 2 * (heads + 2) * u) * scale * magnitude * weights.unsqueeze(-1)).sum(dim=2)
        assert got.shape == want.shape == (batch, C, E)
        assert ((got.double() - want.double()).abs() <= bound).all(), (batch, C, E)
        # the bound is tight enough to catch a wrong formula: a missing ReLU or scale is far outside it
        assert not ((got.double() * 1.001 - want.double()).abs() <= bound).all()


def test_the_closed_column_selection_equals_the_hooked_layout_and_every_call_layout(small):
    """The indexer scores only the entries closed by a query chunk's end unless hook_scores has a hook
    (then every entry is a column): with the indexer's scores pushed towards ReLU's zeros so that many
    rows tie at 0.0 at the k-th place, the selection without a hook equals the one with an identity
    hook on hook_scores, equals the tie rule applied to those scores, and is the same under every
    chunk setting and in a prefill followed by steps."""
    hf, model = small
    index = model.blocks[0].attn.compressor.indexer
    tokens = tokens_of(64, 90, batch=2, seed=5)
    k = hf.config.index_topk
    saved = index.hf.q_b_proj.weight.detach().clone()
    sel, score = "blocks.0.attn.compressor.indexer.hook_selected", "blocks.0.attn.compressor.indexer.hook_scores"

    def run(calls, scores=None):
        seen = []
        hooks = [(sel, lambda t, hook: seen.append(t.clone()))]
        if scores is not None:
            hooks.append((score, lambda t, hook: scores.append((hook.ctx["query_range"], t.clone()))))
        with model.hooks(fwd_hooks=hooks):
            calls()
        return seen

    try:
        with torch.no_grad():
            index.hf.q_b_proj.weight.sub_(index.hf.q_b_proj.weight.abs().mean() * 1.5)  # most q . K < 0
            model.set_query_chunk(None)
            scores = []
            (hooked,) = run(lambda: model(tokens), scores)
            (whole,) = run(lambda: model(tokens))
            assert torch.equal(whole, hooked)
            ((qr, s),) = scores
            assert qr == (0, 90)
            closed = (torch.arange(90) + 1) // 4
            tied = 0
            for b in range(2):
                for t in range(90):
                    if closed[t] <= k:
                        continue
                    row = s[b, t]
                    want = reference_top_k(row, k)
                    assert whole[b, t].tolist() == want, (b, t)
                    tied += int(row[want].min() == 0.0 and (row == 0.0).sum() > (row[want] == 0.0).sum())
            assert tied >= 10, tied  # rows whose k-th place is a tie at 0.0
            for chunk in (1, 5, 64):
                model.set_query_chunk(chunk)
                (chosen,) = run(lambda: model(tokens))
                assert torch.equal(chosen, whole), chunk
            model.set_query_chunk("auto")
            cache = model.init_cache()
            parts = ((0, 37), (37, 38), (38, 90))
            steps = run(lambda: [model(tokens[:, a:b], cache=cache) for a, b in parts])
            for (a, b), s_ in zip(parts, steps):
                assert torch.equal(s_, whole[:, a:b]), (a, b)
    finally:
        with torch.no_grad():
            index.hf.q_b_proj.weight.copy_(saved)
        model.set_query_chunk("auto")


def test_auto_chunks_only_above_the_threshold(small):
    _, model = small
    assert model.query_chunk == "auto"
    assert not is_chunked("auto", AUTO_CHUNK_ABOVE) and is_chunked("auto", AUTO_CHUNK_ABOVE + 1)
    assert not is_chunked(None, 10**6) and is_chunked(3, 2)


def test_long_prompts_take_the_smaller_score_block_and_every_query_once():
    """Up to AUTO_CHUNK_ABOVE tokens a chunk's block is SCORE_BLOCK elements (a short batch stays one
    chunk); above, LONG_SCORE_BLOCK; an integer is the chunk; the ranges cover every query once."""
    per_query = 1000
    assert chunk_size(AUTO_CHUNK_ABOVE, per_query, "auto") == SCORE_BLOCK // per_query
    assert chunk_size(AUTO_CHUNK_ABOVE + 1, per_query, "auto") == LONG_SCORE_BLOCK // per_query
    assert chunk_size(5000, 10**9, "auto") == 1 and chunk_size(5000, per_query, 7) == 7
    for T in (1, AUTO_CHUNK_ABOVE, 5000):
        ranges = chunk_ranges(T, per_query, "auto")
        assert ranges[0][0] == 0 and ranges[-1][1] == T
        assert all(b == c for (_, b), (c, _) in zip(ranges, ranges[1:]))


# ------------------------------------------------------------------------ hooks
def test_per_token_hooks_keep_their_shapes_and_pattern_hooks_fire_per_chunk(small):
    hf, model = small
    tokens = tokens_of(64, 40, batch=2, seed=5)
    with torch.no_grad():
        _, dense = model.run_with_cache(tokens)
        model.set_query_chunk(16)
        try:
            seen = []
            pattern_name = "blocks.0.attn.hook_pattern"
            model.run_with_hooks(tokens, fwd_hooks=[(pattern_name, lambda t, hook: seen.append(
                (tuple(t.shape), hook.ctx["query_range"])))])
            _, chunked = model.run_with_cache(tokens)
        finally:
            model.set_query_chunk("auto")
    assert [r for _, r in seen] == [(0, 16), (16, 32), (32, 40)]
    assert all(shape[2] == b - a for shape, (a, b) in seen)
    assert set(dense.keys()) == set(chunked.keys())
    for name in dense.keys():
        assert chunked[name].shape == dense[name].shape, name
        if chunked[name].is_floating_point():
            torch.testing.assert_close(chunked[name], dense[name], atol=1e-5, rtol=0, msg=name)
        else:
            assert torch.equal(chunked[name].sort(-1).values, dense[name].sort(-1).values), name


def test_an_edit_through_the_pattern_hook_is_the_same_edit_on_both_paths(small):
    """Zero every compressed entry's attention weight of layer 1 (HCA) through ``hook_pattern``: the
    chunked path (hook called per chunk) and the eager path give the same logits."""
    hf, model = small
    band = hf.config.sliding_window
    tokens = tokens_of(64, 50, batch=2, seed=6)

    def drop_entries(pattern, hook):
        pattern = pattern.clone()
        pattern[..., band:] = 0
        return pattern

    hooks = [("blocks.1.attn.hook_pattern", drop_entries)]
    with torch.no_grad():
        dense = model.run_with_hooks(tokens, fwd_hooks=hooks)
        model.set_query_chunk(9)
        try:
            chunked = model.run_with_hooks(tokens, fwd_hooks=hooks)
        finally:
            model.set_query_chunk("auto")
        clean = model(tokens)
    torch.testing.assert_close(chunked, dense, atol=1e-5, rtol=0)
    assert (dense - clean).abs().max() > 1e-3  # the edit did something


# -------------------------------------------------------------------- knockouts
def test_knockout_through_the_chunked_path_equals_the_hooked_forward(small):
    """The fast knockout (clean state tails + the answer position) equals a hooked full forward when
    the clean pass runs chunked."""
    from phaseinterp.interventions.knockout import knockout_measures
    import pandas as pd

    hf, model = small
    tokens = tokens_of(64, 45, batch=3, seed=7)
    answer = torch.tensor([1, 2, 3])
    units = pd.DataFrame({"layer": [0, 1, 2], "heads": [[0], [1], [0, 1]]})
    mean_z = torch.randn(3, model.cfg.n_heads, model.cfg.d_head, generator=torch.Generator().manual_seed(0))
    model.set_query_chunk(8)
    try:
        fast = knockout_measures(model, tokens, 44, answer, units, mean_z, method="fast")
        naive = knockout_measures(model, tokens, 44, answer, units, mean_z, method="naive")
    finally:
        model.set_query_chunk("auto")
    torch.testing.assert_close(fast.knockout_logprob, naive.knockout_logprob, atol=1e-4, rtol=0)
    torch.testing.assert_close(fast.clean_logprob, naive.clean_logprob, atol=1e-4, rtol=0)


def test_last_logits_at_long_prompts_equal_the_full_forward(small):
    hf, model = small
    tokens = tokens_of(64, 77, batch=2, seed=8)
    model.set_query_chunk(10)
    try:
        with torch.no_grad():
            torch.testing.assert_close(model.last_logits(tokens), model(tokens)[:, -1], atol=1e-5, rtol=0)
    finally:
        model.set_query_chunk("auto")


# ------------------------------------------------------------------- bad inputs
@pytest.mark.parametrize("bad", [0, -1, True, 2.5, "16"])
def test_query_chunk_must_be_auto_none_or_a_positive_int(small, bad):
    _, model = small
    with pytest.raises(UserInputError, match="query_chunk"):
        model.set_query_chunk(bad)
    assert model.query_chunk == "auto"


def test_a_prompt_longer_than_max_position_embeddings_is_refused_by_name():
    hf = randomized(published_attention(max_position_embeddings=64, sliding_window=8,
                                        compress_rates={CSA: 4, HCA: 16}))
    model = from_hf(hf)
    with pytest.raises(UserInputError, match=r"65 tokens exceeds the model's max_position_embeddings=64"):
        model(tokens_of(64, 65))
    with pytest.raises(UserInputError, match="max_position_embeddings=64"):
        model.last_logits(tokens_of(64, 65))


# ------------------------------------------------------------- memory and scale
@pytest.mark.slow
def test_memory_estimate_of_the_chunked_forward_is_within_15_percent_of_the_measured_peak():
    from phaseinterp.models.hf.memory import estimate_forward_memory, measure_call_peak

    hf = randomized(published_attention())
    model = from_hf(hf)
    tokens = tokens_of(64, 3000)
    with torch.no_grad():
        measured = measure_call_peak(lambda: model(tokens, return_type=None))
    est = estimate_forward_memory(hf.config, 3000, batch=1, act_bytes=4, weight_bytes=4, logits=False)
    assert est.chunked
    ratio = (est.peak - est.weights) / measured
    assert 0.85 <= ratio <= 1.15, f"estimate / measured = {ratio:.3f}"


def test_the_default_memory_plan_reaches_1m_tokens_where_one_layer_exceeds_a_device():
    from phaseinterp.models.hf.memory import memory_plan

    rows = memory_plan()
    assert [(r["tokens"], r["experiment"]) for r in rows] == [
        (131072, "phase profile"), (131072, "one-layer ablation"),
        (1048576, "phase profile"), (1048576, "one-layer ablation")]
    at_128k = rows[0]
    assert at_128k["devices_80gb"] >= at_128k["devices_141gb"] >= 2
    assert rows[1]["state_gb"] > 0 and rows[1]["devices_80gb"] >= at_128k["devices_80gb"]
    assert rows[2]["devices_80gb"] is None  # one layer's activations exceed a device at 1M tokens


@pytest.mark.parametrize("T", [1, 2049, 5000, 131_072])
@pytest.mark.parametrize("query_chunk", ["auto", None, 7])
@pytest.mark.parametrize("published", [True, False])
def test_the_memory_estimate_reads_two_chunks_and_equals_the_walk_over_every_chunk(T, query_chunk, published,
                                                                                   monkeypatch):
    """`_chunked_terms` evaluates the last full chunk and the final one; walking every chunk (the
    oracle, patched in) gives the same bytes, on the published config and on a small one whose CSA
    chunks cross from shared entries to a gathered top-k."""
    from phaseinterp.models.hf import memory

    cfg = DeepseekV4Config() if published else DeepseekV4Config(
        hidden_size=64, num_attention_heads=4, head_dim=32, q_lora_rank=32, num_hidden_layers=3, sliding_window=16,
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 32}, index_topk=8,
        layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"],
        index_n_heads=2, index_head_dim=16)
    terms = memory._chunked_terms(cfg, T, 3, 2, query_chunk)
    monkeypatch.setattr(memory, "_largest_chunks", lambda T, C: range(0, T, C))
    assert memory._chunked_terms(cfg, T, 3, 2, query_chunk) == terms


def test_the_gpu_script_refuses_a_machine_without_cuda(capsys, monkeypatch):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[1] / "benchmarks" / "dsv4_gpu.py"
    spec = importlib.util.spec_from_file_location("dsv4_gpu", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert script.main([]) == 2
    assert "CUDA is not available" in capsys.readouterr().err
    assert script.main(["--tokens", "0"]) == 2
    assert script.main(["--layers", "44"]) == 2


def test_the_paper_protocol_task_lays_out_128k_tokens_of_16000_records():
    from phaseinterp.tasks import NeedleRetrieval

    task = NeedleRetrieval.paper_protocol()
    geometry = task._geometry(task.pools())
    assert (task.seq_len, geometry["n_records"], task.record_len, task.residue_modulus) == (131072, 16000, 8, 24)
    centre = (geometry["lo"] + geometry["hi"]) / 2
    assert abs(centre - (1 + 248 * 8)) < 80  # where the 249th record lies
    batch = NeedleRetrieval.paper_protocol(seq_len=4096, n_records=400).generate(1, seed=0, strict=False)
    assert batch.tokens.shape == (24, 4096)
    with pytest.raises(ValueError, match="target_record=500 is out of range"):
        NeedleRetrieval.paper_protocol(seq_len=4096, n_records=400, target_record=500)
