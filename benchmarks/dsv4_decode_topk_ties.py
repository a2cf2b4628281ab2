"""Minimal reproduction: transformers' DeepSeek-V4 decodes differently from its own full forward
when the Lightning Indexer's scores tie at the top-k boundary (issue 24 finding).

The indexer score ``sum_h w_h * ReLU(q_h . k)`` is exactly 0.0 for every entry whose q.k is
negative in all index heads, so several entries can tie at 0.0 across the ``index_topk``-th
place. ``torch.topk`` then picks among the tied entries by an implementation-defined rule that
depends on the row it is given: the full forward (and a chunked prefill) scores each query
against every entry of the call, later ones masked to -inf, while a decode step scores one query
against only the entries closed so far. Different tied entries are selected, the attention reads
different compressed entries, and the logits differ (by up to ~0.2 in log-prob at one position
here), although both selections are valid top-k sets of the same scores.

    python benchmarks/dsv4_decode_topk_ties.py            # dsv4-tiny, 16 prompts
    python benchmarks/dsv4_decode_topk_ties.py --model dsv4.1-tiny

CPU, one thread, a few seconds; transformers 5.24's DeepSeek-V4 (eager attention).
"""

import argparse

import torch

import phaseinterp as pi


def topk_tie_demo() -> None:
    """The same scores, as a decode step sees them (11 entries) and as the full forward does (the
    same 11 plus 21 future entries masked to -inf): the top-8 sets differ among the tied zeros."""
    scores = torch.tensor([2.48697, 0.0, 3.42219, 2.6793, -1.53171, 0.0, 0.94325, 0.0, 3.73537, 2.71352, 0.0])
    padded = torch.cat([scores, torch.full((21,), float("-inf"))])
    short, long = sorted(scores.topk(8).indices.tolist()), sorted(padded.topk(8).indices.tolist())
    print(f"torch.topk(k=8) over 11 scores with four exact 0.0 ties: {short}")
    print(f"the same scores padded with 21 x -inf:                 {long}  ({'differs' if short != long else 'same'})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="dsv4-tiny", choices=["dsv4-tiny", "dsv4.1-tiny"])
    parser.add_argument("--prompts", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from transformers import DynamicCache

    topk_tie_demo()
    model = pi.zoo.load(args.model)
    hf = model.hf
    tokens = pi.zoo.task_for(model).generate(2, seed=0, strict=False).tokens[:args.prompts]
    csa = [i for i, kind in enumerate(hf.config.layer_types) if kind == "compressed_sparse_attention"]
    seen: dict[int, list] = {i: [] for i in csa}
    hooks = [hf.model.layers[i].self_attn.compressor.indexer.register_forward_hook(
        lambda mod, inp, out, i=i: seen[i].append(out.detach().clone())) for i in csa]
    with torch.inference_mode():
        full = torch.log_softmax(hf(input_ids=tokens, use_cache=False).logits.float(), -1)
        full_sel = {i: seen[i].pop() for i in csa}
        cache, steps = DynamicCache(config=hf.config), []
        for t in range(tokens.shape[1]):
            out = hf(input_ids=tokens[:, t:t + 1], cache=cache, use_cache=True,
                     position_ids=torch.full((tokens.shape[0], 1), t))
            steps.append(torch.log_softmax(out.logits[:, -1].float(), -1))
    for h in hooks:
        h.remove()
    decode = torch.stack(steps, 1)
    diff = (decode - full).abs().amax(-1)  # [prompt, position]
    rate, k = hf.config.compress_rates["compressed_sparse_attention"], hf.config.index_topk
    print(f"\n{args.model}: CSA rate {rate}, index_topk {k}, {tokens.shape[0]} prompts x {tokens.shape[1]} positions")
    print(f"max |decode - full| of next-token log-probs: {diff.max():.3g}; positions above 1e-3: "
          f"{int((diff > 1e-3).sum())} of {diff.numel()}")
    first_mismatch = {}
    for layer in csa:
        for t in range(tokens.shape[1]):
            for b in range(tokens.shape[0]):
                a = sorted(x for x in full_sel[layer][b, t].tolist() if x >= 0)
                d = sorted(x for x in seen[layer][t][b, 0].tolist() if x >= 0)
                if a != d:
                    first_mismatch.setdefault(b, (layer, t, a, d))
    print(f"prompts whose indexer selection differs somewhere: {len(first_mismatch)} of {tokens.shape[0]}")
    for b, (layer, t, a, d) in sorted(first_mismatch.items()):
        later = diff[b, t:]
        print(f"  prompt {b}: first at layer {layer}, position {t} (phase {t % rate}); full picks {a}, decode "
              f"picks {d}; |d log p| there {diff[b, t]:.3g}, max after {later.max():.3g}")
    clean = [b for b in range(tokens.shape[0]) if b not in first_mismatch]
    if clean:
        print(f"prompts with identical selections everywhere: max |d log p| {diff[clean].max():.3g}")


if __name__ == "__main__":
    main()
