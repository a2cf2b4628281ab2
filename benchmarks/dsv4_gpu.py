"""A V4-Flash-shaped DeepSeek-V4 at 128K tokens on one CUDA device (issue 33): forward and knockout.

    python benchmarks/dsv4_gpu.py [--tokens 131072] [--layers N] [--experts 8] [--dtype bfloat16]
    python benchmarks/dsv4_gpu.py --reduced        # this CPU machine: a small-width model, 8,192 tokens

Builds `DeepseekV4ForCausalLM` from transformers' `DeepseekV4Config()` (the V4-Flash-Base shape:
hidden 4096, 64 query heads of 512 dims, q_lora 1024, o_groups 8, index 64 heads x 128 dims,
top-k 512, sliding window 128, CSA rate 4, HCA rate 128, hc_mult 4, vocab 129,280) with random
weights directly on the device, keeping its first ``--layers`` layers (default: as many as fit in
half the device's memory, the rest left for activations) and ``--experts`` routed experts per
layer (the attention, the indexer and the hyper-connections are the published ones; the routed
experts are narrowed in count only, not in width). Then, through `HookedDeepseekV4` (query chunks,
`set_query_chunk("auto")`): one forward to the last position's logits (`last_logits`, what
`phase_profile` reads) and one knockout (mean replacement of layer 0's KV head at the last
position, the fast path `ablate` takes). Prints seconds and `torch.cuda.max_memory_allocated` for
each. Exits with status 2 and a message when CUDA is missing (unless ``--reduced``).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch


def flash_config(layers: int, experts: int):
    from transformers import DeepseekV4Config

    c = DeepseekV4Config()
    return DeepseekV4Config(**{**c.to_dict(), "num_hidden_layers": layers, "layer_types": c.layer_types[:layers],
                               "mlp_layer_types": c.mlp_layer_types[:layers], "n_routed_experts": experts,
                               "num_experts_per_tok": min(c.num_experts_per_tok, experts),
                               "attn_implementation": "eager"})


def layer_bytes(config, dtype: torch.dtype) -> tuple[int, int]:
    """(bytes of one decoder layer, bytes of everything else) for ``config`` (counted on 'meta')."""
    from transformers import DeepseekV4ForCausalLM

    with torch.device("meta"):
        model = DeepseekV4ForCausalLM(flash_config(1, config.n_routed_experts))
    size = torch.tensor([], dtype=dtype).element_size()
    per_layer = sum(p.numel() for p in model.model.layers.parameters()) * size
    return per_layer, sum(p.numel() for p in model.parameters()) * size - per_layer


def build(config, device: str, dtype: torch.dtype):
    from transformers import DeepseekV4ForCausalLM

    from phaseinterp.models.hf import from_hf

    torch.manual_seed(0)
    with torch.device("meta"):
        hf = DeepseekV4ForCausalLM(config)
    hf = hf.to_empty(device=device).to(dtype)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if p.ndim >= 2:
                p.normal_(0.0, 0.02)
            elif name.endswith(("position_bias", "sinks", "base", "scale")):
                p.normal_(0.0, 1.0)
            else:
                p.fill_(1.0)  # norm weights
        for name, buf in hf.named_buffers():
            if name.endswith("tid2eid"):
                buf.copy_(torch.randint(0, config.n_routed_experts, buf.shape, device=device))
            elif name.endswith("e_score_correction_bias"):
                buf.zero_()
    _recompute_rotary(hf, config, device)
    return from_hf(hf.eval())


def _recompute_rotary(hf, config, device) -> None:
    """``to_empty`` leaves the rotary tables (non-persistent buffers) uninitialised: rebuild each rotary
    module on the device from the config, as transformers builds it."""
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4RotaryEmbedding

    for parent in hf.modules():
        for name, child in list(parent.named_children()):
            if isinstance(child, DeepseekV4RotaryEmbedding):
                setattr(parent, name, DeepseekV4RotaryEmbedding(config, device=device))


def run(model, tokens: int, device: str) -> None:
    import pandas as pd

    from phaseinterp.interventions.knockout import knockout_measures

    ids = torch.randint(0, model.cfg.d_vocab, (1, tokens), generator=torch.Generator().manual_seed(0)).to(device)
    cuda = device.startswith("cuda")

    def timed(label, fn):
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        out = fn()
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        peak = f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GiB peak allocated" if cuda else "CPU"
        print(f"{label}: {seconds:.1f} s, {peak}", flush=True)
        return out

    with torch.no_grad():
        logits = timed(f"forward, {tokens:,} tokens, last-position logits", lambda: model.last_logits(ids))
    assert torch.isfinite(logits).all(), "non-finite logits"
    units = pd.DataFrame({"layer": [0], "heads": [list(range(model.cfg.n_heads))]})
    mean_z = torch.zeros(model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head, device=device)
    out = timed("knockout of layer 0's KV head at the last position",
                lambda: knockout_measures(model, ids, tokens - 1, torch.tensor([1]), units, mean_z, batch_size=1))
    print(f"answer log-prob clean {out.clean_logprob.item():.4f}, knocked out {out.knockout_logprob.item():.4f}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=131072)
    parser.add_argument("--layers", type=int, default=None, help="decoder layers kept (default: what fits)")
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--reduced", action="store_true",
                        help="no GPU: run the small-width published-attention model of benchmarks/dsv4_long.py")
    args = parser.parse_args(argv)
    for name in ("tokens", "experts"):
        if getattr(args, name) < 1:
            print(f"dsv4_gpu: --{name} {getattr(args, name)} must be >= 1", file=sys.stderr)
            return 2
    if args.layers is not None and not 1 <= args.layers <= 43:
        print(f"dsv4_gpu: --layers {args.layers} is out of range 1..43 (V4-Flash has 43)", file=sys.stderr)
        return 2
    if args.reduced:
        sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
        import dsv4_long

        tokens = min(args.tokens, 8192)
        print(f"REDUCED SIZE on CPU: the small-width model of benchmarks/dsv4_long.py (hidden 64, 4 layers, "
              f"published window/rates/top-k), {tokens:,} tokens, float32; not the V4-Flash shape")
        run(dsv4_long.build(), tokens, "cpu")
        return 0
    if not torch.cuda.is_available():
        print("dsv4_gpu: CUDA is not available on this machine (torch.cuda.is_available() is False; torch "
              f"{torch.__version__}); run it on a machine with a GPU, or pass --reduced for the CPU size",
              file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype)
    device = "cuda"
    free, total = torch.cuda.mem_get_info()
    probe = flash_config(1, args.experts)
    per_layer, rest = layer_bytes(probe, dtype)
    layers = args.layers or max(1, min(43, int((free // 2 - rest) // per_layer)))
    print(f"{torch.cuda.get_device_name()} ({total / 2**30:.0f} GiB): V4-Flash attention, {layers} of 43 layers, "
          f"{args.experts} routed experts per layer, {args.dtype}; weights {(rest + layers * per_layer) / 2**30:.1f} GiB")
    model = build(flash_config(layers, args.experts), device, dtype)
    run(model, args.tokens, device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
