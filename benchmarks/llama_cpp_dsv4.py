"""llama.cpp's DeepSeek-V4 against transformers (issue 34): the fixture, the conversion, the table.

    python benchmarks/llama_cpp_dsv4.py fixture runs/llama_cpp/fixture
    python benchmarks/llama_cpp_dsv4.py convert runs/llama_cpp/fixture/release runs/llama_cpp/fixture.gguf \
        --llama-cpp-src /tmp/llsrc/src/llama_cpp_python-0.3.36/vendor/llama.cpp
    python benchmarks/llama_cpp_dsv4.py conformance runs/llama_cpp/fixture/release runs/llama_cpp/fixture.gguf \
        --out runs/llama_cpp/conformance
    python benchmarks/llama_cpp_dsv4.py server runs/llama_cpp/fixture/release runs/llama_cpp/fixture.gguf
    python benchmarks/llama_cpp_dsv4.py margins runs/llama_cpp/fixture/release --positions 1437,1883,2122

``fixture``: a DeepSeek-V4 with the published attention settings llama.cpp's loader accepts
(``DeepseekV4Config()``'s head_dim 512 / rotary 64 / indexer head 128 / top-k 512 / window 128,
``hc_mult`` 4, compress ratios 0, 4 and 128), scaled down elsewhere (3 layers: sliding, CSA, HCA;
hidden 256; 4 query heads in 4 output groups; 4 routed experts, top-2; one hash-routed layer;
vocabulary 512), **random weights** (seeded; no CPU time to train one here), the embedding drawn
at std 1 and the unembedding at 0.15, so the next-token logits spread with a std of about 2.4,
neither near-uniform (where a check of log-probs would pass anything) nor one-hot. It is exported with
`phaseinterp.models.hf.export.export_release` (DeepSeek's layout, MXFP4 experts, float32 elsewhere)
beside a synthetic byte-level BPE tokenizer (`write_tokenizer`).

``convert``: llama.cpp's own ``convert_hf_to_gguf.py`` with one accommodation: its BPE
pre-tokenizer check (a hash of how the tokenizer splits a fixed text, matched against the
tokenizers of published models) cannot know a synthetic tokenizer, so an unrecognised hash is
named ``"default"`` instead of raising. Only the tokenizer's pre-split rule is affected;
phaseinterp sends token ids, so llama.cpp never tokenizes text here.

``server``: llama-cpp-python's OpenAI-compatible server on the GGUF, asked through `OpenAIEngine`.

``conformance``: `phaseinterp.conformance` of `LlamaCppEngine` (full prompt, and the prompt
prefilled in pieces cut at the given phases, each piece one ``llama_decode``) against
transformers (`load_hf` of the exported folder: the experts as the GGUF holds them).
"""

from __future__ import annotations

import argparse
import json
import runpy
import sys
import time
from pathlib import Path

CSA, HCA, SWA = "compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"
FIXTURE = dict(num_hidden_layers=3, layer_types=[SWA, CSA, HCA], hidden_size=256, num_attention_heads=4,
               o_groups=4, q_lora_rank=256, o_lora_rank=256, index_n_heads=4, n_routed_experts=4,
               num_experts_per_tok=2, moe_intermediate_size=256, num_hash_layers=1, vocab_size=512,
               num_nextn_predict_layers=0, max_position_embeddings=8192)
TASK = dict(seq_len=2304, n_records=48, n_demos=4, residue_modulus=4, padding="in_sequence")


def build_fixture(out: Path, seed: int = 0, max_positions: int = FIXTURE["max_position_embeddings"]):
    """The fixture model (see module doc), exported to ``out / "release"`` with its tokenizer;
    ``max_positions``: its ``max_position_embeddings`` (longer prompts: `llama_vs_phaseinterp.py`)."""
    import torch
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

    import phaseinterp as pi
    from phaseinterp.models.hf.export import export_release
    from phaseinterp.tasks import KeyValueRetrieval

    torch.manual_seed(seed)
    config = DeepseekV4Config(**{**FIXTURE, "max_position_embeddings": max_positions})
    hf = DeepseekV4ForCausalLM(config).float().eval()
    with torch.no_grad():
        hf.model.embed_tokens.weight.normal_(0.0, 1.0)
        hf.lm_head.weight.normal_(0.0, 0.15)  # final RMS-normed state x 256 dims: logits of std ~2.4
    model = pi.from_hf(hf, name="dsv4-llamacpp-fixture")
    task = KeyValueRetrieval(**TASK)
    model.metadata.update({"task": task.to_dict(), "task_type": "KeyValueRetrieval",
                           "fixture": {"config": {**FIXTURE, "max_position_embeddings": max_positions}, "seed": seed,
                                       "weights": "random (embed std 1, head std 0.15)",
                                       "command": f"python benchmarks/llama_cpp_dsv4.py fixture {out}"
                                                  + (f" --max-positions {max_positions}"
                                                     if max_positions != FIXTURE["max_position_embeddings"] else "")}})
    result = export_release(model, out / "release", max_shard_bytes="200MB")
    write_tokenizer(out / "release", config.vocab_size, config.bos_token_id, config.eos_token_id)
    return result


def write_tokenizer(folder: Path, vocab_size: int, bos: int, eos: int) -> None:
    """A byte-level BPE tokenizer of exactly ``vocab_size`` tokens (``tokenizer.json`` and
    ``tokenizer_config.json``): the 256 byte symbols (GPT-2's byte-to-unicode map; the first
    ``vocab_size - 1`` of them for a smaller vocabulary), then merges of byte pairs up to the size.
    Synthetic: it only gives llama.cpp's converter the token list and merges a GGUF vocabulary needs;
    the model's ids are the task's, never text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    if vocab_size < 3:
        raise ValueError(f"vocab_size={vocab_size} is too small for a BPE vocabulary with a merge (>= 3)")
    byte_map = _bytes_to_unicode()
    base = [byte_map[b] for b in range(min(256, vocab_size - 1))]  # a smaller model: the first byte symbols
    vocab = {s: i for i, s in enumerate(base)}
    merges = []
    for k in range(vocab_size - len(base)):  # llama.cpp's BPE loader needs at least one merge
        a, b = base[(k // len(base)) % len(base)], base[k % len(base)]
        merges.append((a, b))
        vocab[a + b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(folder / "tokenizer.json"))
    inverse = {i: s for s, i in vocab.items()}
    special = {f"{k}_token": inverse[i] for k, i in (("bos", bos), ("eos", eos)) if i is not None}
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", **special, "add_bos_token": False, "model_max_length": 8192},
        indent=2))


def _bytes_to_unicode() -> dict[int, str]:
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def convert(release: Path, gguf: Path, llama_cpp_src: Path, outtype: str = "f32") -> float:
    """llama.cpp's ``convert_hf_to_gguf.py RELEASE --outfile GGUF --outtype OUTTYPE`` with the
    pre-tokenizer accommodation (module doc), in this process; returns the seconds it took."""
    src = Path(llama_cpp_src)
    script = src / "convert_hf_to_gguf.py"
    if not script.is_file():
        raise FileNotFoundError(f"{script} does not exist (pass llama.cpp's source folder, e.g. the vendor/llama.cpp "
                                "of llama-cpp-python's sdist)")
    sys.path[:0] = [str(src / "gguf-py"), str(src)]
    from conversion.base import TextModel

    original = TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self, tokenizer) -> str:
        try:
            return original(self, tokenizer)
        except NotImplementedError:  # the hash of a synthetic tokenizer: llama.cpp's default pre-split rule
            return "default"

    TextModel.get_vocab_base_pre = get_vocab_base_pre
    argv = sys.argv
    sys.argv = [str(script), str(release), "--outfile", str(gguf), "--outtype", outtype]
    start = time.perf_counter()
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv = argv
    return time.perf_counter() - start


def conformance(release: Path, gguf: Path, out: Path, *, cut_phases, n_per_residue: int = 1,
                cache_types=("f16",), chunk: int = 512, threads=None):
    """The per-phase table of llama.cpp (full prompt, and prefill cut at ``cut_phases`` mod 128; one
    set per KV cache type) against transformers; saved to ``out`` (`ConformanceResult.save`)."""
    import torch

    import phaseinterp as pi
    from phaseinterp.engines import chunked_pieces, conformance as run_conformance, cut_period
    from phaseinterp.engines.llama_cpp import LlamaCppEngine

    model = pi.load_hf(release, dtype=torch.float32)
    task = pi.zoo.task_for(model)
    period = cut_period(model)
    engines = {}
    for cache_type in cache_types:
        base = LlamaCppEngine(gguf, n_ctx=task.seq_len + 8, n_batch=task.seq_len + 8, cache_type=cache_type,
                              n_threads=threads, name=f"{cache_type}:full")
        engines[base.name] = base
        for c in cut_phases:
            name = f"{cache_type}:cut{c}"
            engines[name] = base.with_schedule(lambda n, c=c: chunked_pieces(n, c, period, chunk), name)
    start = time.perf_counter()
    result = run_conformance(model, task, modes=(), engines=engines, n_per_residue=n_per_residue, seed=0,
                             label="llama.cpp vs transformers (DeepSeek-V4 fixture)", progress=True)
    seconds = time.perf_counter() - start
    result.save(out)
    return result, seconds


def server_check(release: Path, gguf: Path, port: int = 8765, n_prompts: int = 2, timeout: float = 600.0) -> dict:
    """llama-cpp-python's own OpenAI-compatible server (``python -m llama_cpp.server``, its ``[server]``
    extra) on the GGUF, asked through `OpenAIEngine` exactly as a vLLM server would be (token-id
    prompts, top-20 log-probs). Returns what came back: the error, or the top-k against transformers."""
    import subprocess
    import tempfile
    import urllib.request

    import torch

    import phaseinterp as pi
    from phaseinterp.engines import OpenAIEngine

    model = pi.load_hf(release, dtype=torch.float32)
    task = pi.zoo.task_for(model)
    tokens = task.generate(1, seed=0, strict=False).tokens[:n_prompts]
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--n_ctx", str(task.seq_len + 8),
           "--n_batch", str(task.seq_len + 8), "--host", "127.0.0.1", "--port", str(port)]
    # The server's log goes to a file: it writes ~90 KB (llama.cpp's loader, the chat template) before it listens,
    # more than a pipe holds, so an undrained PIPE blocked it before it was ready (seen: never up in 120 s).
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True)
    out = {"command": " ".join(cmd)}
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None:
                    out["server_exit"] = proc.returncode
                    log.seek(0)
                    out["server_output"] = log.read()[-2000:]
                    return out
                time.sleep(1)
        else:
            out["error"] = "the server did not answer /v1/models within 120 s"
            return out
        engine = OpenAIEngine(f"http://127.0.0.1:{port}", "fixture", d_vocab=model.cfg.d_vocab, timeout=timeout)
        try:
            got = engine(tokens)
        except Exception as err:  # what the real server answers is the finding
            out["error"] = f"{type(err).__name__}: {err}"
            return out
        with torch.no_grad():
            ref = torch.log_softmax(model.hf(input_ids=tokens, use_cache=False).logits[:, -1].float(), -1)
        seen = ~torch.isnan(got)
        out["reported_per_prompt"] = seen.sum(1).tolist()
        out["max_abs_diff"] = float((got - ref).abs()[seen].max())
        out["top1_agree"] = (torch.where(seen, got, torch.tensor(-float("inf"))).argmax(1) == ref.argmax(1)).tolist()
        return out
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def positions(release: Path, gguf: Path, cache_type: str = "f32", bucket: int = 256) -> "object":
    """Where along one prompt llama.cpp departs from transformers: max |d log p| over the vocabulary at
    every position of the first evaluation prompt (llama.cpp with ``logits_all``, the prompt in one
    ``llama_decode``), summarised per ``bucket`` positions and per phase mod 4 / mod 128. The
    indexer's top-k (512 of the CSA layer's ``(t + 1) // 4`` entries) starts to choose at t = 2,051."""
    import llama_cpp
    import numpy as np
    import pandas as pd
    import torch

    import phaseinterp as pi

    model = pi.load_hf(release, dtype=torch.float32)
    task = pi.zoo.task_for(model)
    ids = task.generate(1, seed=0, strict=False).tokens[:1]
    n = ids.shape[1]
    ggml = {"f16": llama_cpp.GGML_TYPE_F16, "f32": llama_cpp.GGML_TYPE_F32}[cache_type]
    llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=n + 8, n_batch=n + 8, n_ubatch=n + 8, logits_all=True,
                          type_k=ggml, type_v=ggml, verbose=False)
    llm.eval(ids[0].tolist())
    ours = torch.log_softmax(torch.from_numpy(np.array(llm.scores[:n], dtype=np.float32)), -1)
    with torch.no_grad():
        ref = torch.log_softmax(model.hf(input_ids=ids, use_cache=False).logits[0].float(), -1)
    diff = (ours - ref).abs().amax(-1).numpy()
    frame = pd.DataFrame({"pos": np.arange(n), "max_abs_diff": diff,
                          "top1_agree": (ours.argmax(-1) == ref.argmax(-1)).numpy()})
    frame["bucket"] = frame.pos // bucket * bucket
    print(frame.groupby("bucket").agg(max_abs_diff=("max_abs_diff", "max"), top1=("top1_agree", "mean")).to_string())
    print(frame.groupby(frame.pos % 4).max_abs_diff.max().rename("max by pos mod 4").to_string())
    worst = frame.nlargest(5, "max_abs_diff")
    print("worst positions:", worst[["pos", "max_abs_diff"]].to_dict("records"))
    return frame


def margins(release: Path, positions_of_interest=(1437, 1883, 2122)) -> "object":
    """How close transformers is to choosing differently at each position of the first evaluation
    prompt (the prompt of `positions`), where a small rounding difference in llama.cpp could flip
    a discrete choice. Per position, for every MoE layer with a learned router: the gap between
    the biased scores of its 2nd and 3rd expert (top-2 of 4); for the CSA layer's indexer: the gap
    between the 512th and 513th score among the entries the query may see (only past t = 2,051,
    where more than 512 are closed). Prints each position of interest with its gap and the rank of
    that gap among all positions (1 = the closest call of the prompt)."""
    import pandas as pd
    import torch

    import phaseinterp as pi

    model = pi.load_hf(release, dtype=torch.float32)
    task = pi.zoo.task_for(model)
    ids = task.generate(1, seed=0, strict=False).tokens[:1]
    n = ids.shape[1]
    hf = model.hf
    gaps, handles = {}, []

    def router_hook(name):
        def hook(module, args, output):
            scores = module.score_fn(output[0].float())  # the router's own logits and scoring function
            biased = (scores + module.e_score_correction_bias).reshape(n, -1)
            top = biased.topk(3, dim=-1).values
            gaps[name] = (top[:, 1] - top[:, 2]).detach()
        return hook

    def scorer_hook(name, rate, k):
        def hook(module, args, output):
            scores = output[0].float()  # [S, T]
            entries = torch.arange(scores.shape[-1])
            visible = entries.view(1, -1) < ((torch.arange(n) + 1) // rate).view(-1, 1)
            masked = scores.masked_fill(~visible, float("-inf"))
            top = masked.topk(min(k + 1, scores.shape[-1]), dim=-1).values
            gap = top[:, k - 1] - top[:, k] if top.shape[-1] > k else torch.full((n,), float("nan"))
            gap[visible.sum(-1) <= k] = float("nan")  # nothing to choose: every visible entry is taken
            gaps[name] = gap.detach()
        return hook

    for i, layer in enumerate(hf.model.layers):
        router = getattr(layer.mlp, "gate", None)
        if router is not None and hasattr(router, "e_score_correction_bias"):
            handles.append(router.register_forward_hook(router_hook(f"layer {i} router 2nd-3rd")))
        compressor = getattr(layer.self_attn, "compressor", None)
        indexer = getattr(compressor, "indexer", None) if compressor is not None else None
        if indexer is not None:
            handles.append(indexer.scorer.register_forward_hook(
                scorer_hook(f"layer {i} indexer 512th-513th", indexer.compress_rate, indexer.index_topk)))
    try:
        with torch.no_grad():
            hf(input_ids=ids, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    frame = pd.DataFrame({name: gap.numpy() for name, gap in gaps.items()})
    ranks = frame.rank(method="min")
    rows = []
    for pos in positions_of_interest:
        row = {"pos": pos}
        for name in frame.columns:
            row[name] = f"{frame.at[pos, name]:.2e} (rank {ranks.at[pos, name]:.0f} of {frame[name].notna().sum()})" \
                if pd.notna(frame.at[pos, name]) else "-"
        rows.append(row)
    print(pd.DataFrame(rows).set_index("pos").to_string())
    print("median gap:", {name: float(f"{frame[name].median():.3g}") for name in frame.columns})
    for name in frame.columns:
        exact = frame.index[frame[name] == 0].tolist()
        if exact:
            print(f"{name}: exact ties (gap 0.0) at {len(exact)} positions: {exact[:20]}")
    return frame


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("tokenizer", help="write the synthetic tokenizer beside an exported checkpoint")
    t.add_argument("release")
    f = sub.add_parser("fixture")
    f.add_argument("out")
    f.add_argument("--seed", type=int, default=0)
    f.add_argument("--max-positions", type=int, default=FIXTURE["max_position_embeddings"])
    c = sub.add_parser("convert")
    c.add_argument("release")
    c.add_argument("gguf")
    c.add_argument("--llama-cpp-src", required=True)
    c.add_argument("--outtype", default="f32")
    k = sub.add_parser("conformance")
    k.add_argument("release")
    k.add_argument("gguf")
    k.add_argument("--out", required=True)
    k.add_argument("--cut-phases", default="0,1,2,3,64,127")
    k.add_argument("--n-per-residue", type=int, default=1)
    k.add_argument("--cache-types", default="f16,f32")
    k.add_argument("--chunk", type=int, default=512)
    k.add_argument("--threads", type=int, default=None)
    q = sub.add_parser("positions")
    q.add_argument("release")
    q.add_argument("gguf")
    q.add_argument("--cache-type", default="f32")
    m = sub.add_parser("margins", help="transformers' closest calls (router top-2, indexer top-k) per position")
    m.add_argument("release")
    m.add_argument("--positions", default="1437,1883,2122")
    v = sub.add_parser("server")
    v.add_argument("release")
    v.add_argument("gguf")
    v.add_argument("--port", type=int, default=8765)
    args = parser.parse_args(argv)
    if args.command == "tokenizer":
        cfg = json.loads((Path(args.release) / "config.json").read_text())
        write_tokenizer(Path(args.release), cfg["vocab_size"], cfg.get("bos_token_id"), cfg.get("eos_token_id"))
    elif args.command == "fixture":
        start = time.perf_counter()
        print(build_fixture(Path(args.out), args.seed, args.max_positions), f"({time.perf_counter() - start:.1f} s)")
    elif args.command == "convert":
        seconds = convert(Path(args.release), Path(args.gguf), Path(args.llama_cpp_src), args.outtype)
        print(f"converted in {seconds:.1f} s")
    elif args.command == "positions":
        positions(Path(args.release), Path(args.gguf), args.cache_type)
    elif args.command == "margins":
        margins(Path(args.release), [int(x) for x in args.positions.split(",") if x])
    elif args.command == "server":
        print(json.dumps(server_check(Path(args.release), Path(args.gguf), args.port), indent=2))
    else:
        cuts = [int(x) for x in args.cut_phases.split(",") if x]
        result, seconds = conformance(Path(args.release), Path(args.gguf), Path(args.out), cut_phases=cuts,
                                      n_per_residue=args.n_per_residue, cache_types=args.cache_types.split(","),
                                      chunk=args.chunk, threads=args.threads)
        import pandas as pd

        with pd.option_context("display.width", 200, "display.max_rows", 500):
            print(result.table[["setting", "kind", "phase", "n", "max_abs_diff", "mean_abs_diff", "agreement",
                                "passed"]].to_string(index=False))
        print(f"{seconds:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
