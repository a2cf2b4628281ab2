"""The same DeepSeek-V4 in two engines: phaseinterp's forward against llama.cpp (prebuilt), side by side.

    python benchmarks/llama_vs_phaseinterp.py --out runs/llama_vs_phaseinterp \
        --llama-cpp-src /tmp/phaseinterp-llama-cpp-0.3.36/vendor/llama.cpp [--lengths 2048 8192 32768] [--threads 1]

The model is `benchmarks/llama_cpp_dsv4.py`'s fixture (random weights; sliding, CSA and HCA layers with the
published window 128, rates 4 and 128, indexer top-k 512, head_dim 512), built with
``max_position_embeddings`` = the longest length and converted by llama.cpp's own converter. Per length T,
one prompt of T random ids, each engine in a process of its own (so each peak is its own):

- phaseinterp: `load_hf(release)` (float32), then ``model.last_logits(tokens)`` (what `phase_profile`
  reads: the chunked forward, the last layer at the final position only), ``torch.set_num_threads``.
- llama.cpp: `PrebuiltLlama` (``llama-cpp-py-sync``, f32 KV cache, ``n_ubatch`` = ``n_batch`` =
  ``--ubatch``), the prompt decoded in ``--ubatch`` pieces, logits of the last token only. Its worker
  imports no torch (the package ``__init__`` is skipped), so its RSS is llama.cpp's own.

Time: wall seconds of that call only (the model already loaded; median of ``--repeats``). Memory: the
process's peak RSS (``VmHWM``) and that peak minus the RSS just before the call (the call's own working
memory). The last logits of the two are compared (max |d log p|).

The compute bound (useful FLOPs, 2 per multiply-add; t = 0..T-1, sums over layers):

    band       4 * H * d_head * min(t + 1, W)                 every layer (the raw window)
    entries    4 * H * d_head * e(t),  e(t) = min(K, (t + 1) // 4)   CSA (the indexer's top-K)
                                       e(t) = (t + 1) // 128          HCA (every closed entry)
    indexer    2 * H_idx * d_idx * (t + 1) // 4                CSA (scores of every closed entry)
    top-k      (t + 1) // 4  where (t + 1) // 4 > K            CSA (one comparison per candidate)
    dense      2 * T * P_active + 2 * d_model * V              projections, compressors, mHC, router,
                                                               shared and routed experts (k of E), head once

``P_active``: every 2-D weight of the model but the embedding, the head, the compressors' additive
positions and the hash layer's table, the routed experts' scaled by k / E. Elementwise work (softmax,
norms, RoPE, Sinkhorn) is not counted. The bound is FLOPs / the machine's float32 GEMM rate on the same
threads (median of 5 square matmuls of side 1,024, `dsv4_compute_bound.py`'s yardstick), measured in
the parent between the workers; "x bound" is measured seconds / bound.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))


# ------------------------------------------------------------------ the compute bound
def fixture_flops(release: Path, T: int) -> dict:
    """The useful FLOPs of one forward over T tokens of the model in ``release`` (module doc), by part."""
    import torch
    from safetensors import safe_open

    cfg = json.loads((release / "config.json").read_text())
    t = torch.arange(1, T + 1, dtype=torch.float64)  # t + 1 tokens visible to query t
    H, d_head, W, K = cfg["num_attention_heads"], cfg["head_dim"], cfg["sliding_window"], cfg["index_topk"]
    parts = dict.fromkeys(("band", "entries", "indexer", "top-k", "dense"), 0.0)
    for rate in cfg["compress_ratios"]:
        parts["band"] += float((4 * H * d_head * t.clamp(max=W)).sum())
        closed = torch.div(t, rate, rounding_mode="floor") if rate else torch.zeros_like(t)
        if rate == 4:
            parts["entries"] += float((4 * H * d_head * closed.clamp(max=K)).sum())
            parts["indexer"] += float((2 * cfg["index_n_heads"] * cfg["index_head_dim"] * closed).sum())
            parts["top-k"] += float(closed[closed > K].sum())
        elif rate:
            parts["entries"] += float((4 * H * d_head * closed).sum())
    share = cfg["num_experts_per_tok"] / cfg["n_routed_experts"]
    active = 0.0
    for shard in sorted(release.glob("*.safetensors")):
        with safe_open(str(shard), "pt") as f:
            for name in f.keys():
                shape = f.get_slice(name).get_shape()
                dtype = f.get_slice(name).get_dtype()
                if (len(shape) != 2 or name.endswith((".scale", ".ape")) or dtype == "I64"  # scales, positions, hash
                        or "embed" in name or name.startswith("head")):
                    continue
                n = shape[0] * shape[1] * (2 if dtype in ("I8", "U8") else 1)  # MXFP4: two weights a byte
                active += n * (share if ".experts." in name else 1.0)
    parts["dense"] = 2 * T * active + 2 * cfg["hidden_size"] * cfg["vocab_size"]
    parts["total"] = sum(parts.values())
    return parts


# ------------------------------------------------------------------ the workers (one process each)
def _rss() -> tuple[int, int]:
    """(VmRSS, VmHWM) of this process in bytes."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) * 1024
    return fields["VmRSS"], fields["VmHWM"]


def worker_phaseinterp(release: str, ids_file: str, out: str, threads: int, repeats: int) -> dict:
    import numpy as np
    import torch

    import phaseinterp as pi

    torch.set_num_threads(threads)
    model = pi.load_hf(release, dtype=torch.float32)
    tokens = torch.from_numpy(np.load(ids_file)).long()[None]
    times, before = [], _rss()[0]
    with torch.inference_mode():
        for _ in range(repeats):
            start = time.perf_counter()
            logits = model.last_logits(tokens)[0]
            times.append(time.perf_counter() - start)
    np.save(out, logits.float().numpy())
    rss, peak = _rss()
    return {"seconds": statistics.median(times), "peak_rss": peak, "working": peak - before, "rss_before": before}


def worker_llama(gguf: str, ids_file: str, out: str, threads: int, repeats: int, ubatch: int) -> dict:
    import numpy as np

    # phaseinterp's __init__ imports torch; the prebuilt backend needs only its own module and errors.py
    for package in ("phaseinterp", "phaseinterp.engines"):
        module = types.ModuleType(package)
        module.__path__ = [str(ROOT / package.replace(".", "/"))]
        sys.modules[package] = module
    from phaseinterp.engines.llama_prebuilt import PrebuiltLlama

    assert "torch" not in sys.modules
    ids = [int(x) for x in np.load(ids_file)]
    llm = PrebuiltLlama(gguf, n_ctx=len(ids) + 8, n_batch=ubatch, n_ubatch=ubatch, cache_type="f32", n_threads=threads)
    times, before = [], _rss()[0]
    for _ in range(repeats):
        llm.clear()
        start = time.perf_counter()
        for pos in range(0, len(ids), ubatch):
            llm.decode(ids[pos:pos + ubatch], pos)
        logits = llm.last_logits()
        times.append(time.perf_counter() - start)
    np.save(out, logits)
    rss, peak = _rss()
    llm.close()
    return {"seconds": statistics.median(times), "peak_rss": peak, "working": peak - before, "rss_before": before}


def _run_worker(argv: list[str], timeout: float) -> dict:
    done = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True, cwd=ROOT, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"worker {argv[0]} exited {done.returncode}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------ the run
def prepare(out: Path, llama_cpp_src: Path, max_positions: int) -> tuple[Path, Path]:
    """(release, gguf) of the fixture with ``max_position_embeddings`` = ``max_positions`` (built once)."""
    release, gguf = out / "fixture" / "release", out / "fixture.gguf"
    if not gguf.is_file():
        for argv in (["fixture", str(out / "fixture"), "--max-positions", str(max_positions)],
                     ["convert", str(release), str(gguf), "--llama-cpp-src", str(llama_cpp_src)]):
            done = subprocess.run([sys.executable, str(Path(__file__).parent / "llama_cpp_dsv4.py"), *argv],
                                  capture_output=True, text=True, cwd=ROOT)
            if done.returncode != 0:
                raise RuntimeError(f"llama_cpp_dsv4.py {argv[0]} failed: {done.stderr[-2000:]}")
    held = json.loads((release / "config.json").read_text())["max_position_embeddings"]
    if held < max_positions:
        raise SystemExit(f"{release} holds max_position_embeddings={held} < {max_positions}: use another --out")
    return release, gguf


def main(argv=None) -> int:
    import numpy as np

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--llama-cpp-src", required=True, type=Path)
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192, 32768])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--ubatch", type=int, default=512, help="llama.cpp's n_batch = n_ubatch (its default ubatch)")
    parser.add_argument("--timeout", type=float, default=7200.0, help="seconds per worker")
    args = parser.parse_args(argv)
    for name in ("threads", "repeats", "ubatch"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}={getattr(args, name)} must be >= 1")
    if min(args.lengths) < 2:
        parser.error(f"--lengths must be >= 2 (got {min(args.lengths)})")
    args.out.mkdir(parents=True, exist_ok=True)
    release, gguf = prepare(args.out, args.llama_cpp_src, max(args.lengths))
    print(f"# llama_vs_phaseinterp: {release} ({gguf.stat().st_size:,} bytes GGUF); float32, f32 KV cache; "
          f"{args.threads} thread(s); llama.cpp ubatch {args.ubatch}; median of {args.repeats}")
    import torch
    from dsv4_compute_bound import gemm_rate  # imports torch: the parent only, never the llama worker

    torch.set_num_threads(args.threads)
    print("| T | phaseinterp s | llama.cpp s | time ratio (pi / llama) | phaseinterp peak RSS MB (call) | "
          "llama.cpp peak RSS MB (call) | peak ratio (call) | GFLOP | GEMM GFLOP/s | bound s | "
          "x bound (pi / llama) | max abs d log p |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for T in args.lengths:
        ids = np.random.default_rng(T).integers(2, 512, T)
        ids_file = args.out / f"ids_{T}.npy"
        np.save(ids_file, ids)
        common = [str(ids_file), str(args.threads), str(args.repeats)]
        pi_run = _run_worker(["phaseinterp", str(release), *common[:1], str(args.out / f"pi_{T}.npy"), *common[1:]],
                             args.timeout)
        ll_run = _run_worker(["llama", str(gguf), *common[:1], str(args.out / f"llama_{T}.npy"), *common[1:],
                              str(args.ubatch)], args.timeout)

        def log_softmax(x):
            x = x.astype(np.float64)
            return x - x.max() - np.log(np.exp(x - x.max()).sum())

        diff = float(np.abs(log_softmax(np.load(args.out / f"pi_{T}.npy"))
                            - log_softmax(np.load(args.out / f"llama_{T}.npy"))).max())
        flops, rate = fixture_flops(release, T), gemm_rate()  # dsv4_compute_bound's yardstick
        bound = flops["total"] / rate
        row = {"T": T, "phaseinterp": pi_run, "llama": ll_run, "flops": flops, "gemm_rate": rate, "bound_s": bound,
               "max_abs_diff": diff}
        rows.append(row)
        mb = 1 << 20
        print(f"| {T:,} | {pi_run['seconds']:.2f} | {ll_run['seconds']:.2f} | "
              f"{pi_run['seconds'] / ll_run['seconds']:.2f} | {pi_run['peak_rss'] / mb:,.0f} "
              f"({pi_run['working'] / mb:,.0f}) | {ll_run['peak_rss'] / mb:,.0f} ({ll_run['working'] / mb:,.0f}) | "
              f"{pi_run['peak_rss'] / ll_run['peak_rss']:.2f} ({pi_run['working'] / max(ll_run['working'], 1):.2f}) | "
              f"{flops['total'] / 1e9:.2f} | {rate / 1e9:.1f} | {bound:.2f} | {pi_run['seconds'] / bound:.1f} / "
              f"{ll_run['seconds'] / bound:.1f} | {diff:.1e} |", flush=True)
    for row in rows:
        parts = ", ".join(f"{k} {v / 1e9:.3f}" for k, v in row["flops"].items() if k != "total")
        print(f"T={row['T']:,} GFLOP by part: {parts}")
    (args.out / "results.json").write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ("phaseinterp", "llama"):
        kind, rest = sys.argv[1], sys.argv[2:]
        if kind == "phaseinterp":
            result = worker_phaseinterp(rest[0], rest[1], rest[2], int(rest[3]), int(rest[4]))
        else:
            result = worker_llama(rest[0], rest[1], rest[2], int(rest[3]), int(rest[4]), int(rest[5]))
        print(json.dumps(result))
    else:
        raise SystemExit(main())
