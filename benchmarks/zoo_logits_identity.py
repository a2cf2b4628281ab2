"""Record (or compare) zoo-checkpoint logits: full forward, incremental cache, a one-token step in 2
variants over a fork of the prefix's cache (``last``), last_logits
(the own family); full forward and last_logits (the DeepSeek-V4 family's zoo folders, through load_hf).

python benchmarks/zoo_logits_identity.py record|compare [--slot]  (record before a change, compare after;
the reference lives in the git-ignored runs/issue11/)

``--slot`` runs the own family's attention on the explicit softmax (an identity hook on every
``hook_pattern``), as before the fused kernel: compared
bit for bit, it separates a change of summation order (the fused kernel) from any other change.
Each row prints max |diff|, that difference relative to the largest |logit| and whether every
argmax is identical; ALL OK means every prediction identical and every logit within 1e-4 relative.
A DeepSeek-V4 folder's row can differ where its indexer's scores tie exactly at the top-k boundary
(ties go to the lowest entries since the cache; before, ``torch.topk``'s order): ``compare`` then also
prints, per such folder, the check against transformers on the same tokens
(`phaseinterp.models.hf.against_hf.check_against_transformers`: selections the same up to ties, the
logits with transformers' selection in place).
"""
import sys
from pathlib import Path

import torch

from phaseinterp.models import CompressedTransformer

torch.set_num_threads(1)

OUT = Path("runs/issue11/reference_logits.pt")
CK = Path("phaseinterp/zoo/checkpoints")


def run_all(names=None, hooks=()):
    res = {}
    for d in sorted(CK.iterdir()):
        if not (d / "config.json").is_file() or (names is not None and d.name not in names):
            continue
        if (d / "phaseinterp.json").is_file():  # a Hugging Face DeepSeek-V4 folder
            res[d.name] = hf_logits(d)
            continue
        m = CompressedTransformer.from_pretrained(d)
        with m.hooks(fwd_hooks=list(hooks)):
            res[d.name] = own_logits(m)
    return res


def own_logits(m) -> dict:
    g = torch.Generator().manual_seed(0)
    T = m.cfg.n_ctx
    tokens = torch.randint(0, m.cfg.d_vocab, (3, T), generator=g)
    with torch.no_grad():
        full = m(tokens)
        cache = m.init_cache()
        pieces, s = [], 0
        for n in (1, 3, 5, 7, 16, T - 32):
            pieces.append(m(tokens[:, s:s + n], cache=cache))
            s += n
        inc = torch.cat(pieces, 1)
        # the last token in 2 variants (the second's embedding moved by 0.1) over a fork of the prefix cache
        cache = m.init_cache()
        m(tokens[:, :-1], cache=cache)
        resid = m.W_E[tokens[:, -1]][:, None].expand(-1, 2, -1).clone()
        resid[:, 1] += 0.1
        last = m(resid.reshape(-1, 1, resid.shape[-1]), cache=cache.fork(2), start_at_layer=0).reshape(3, 2, -1)
        final = m.last_logits(tokens)  # a prefill and one step
    return dict(full=full, inc=inc, last=last, final=final)


def hf_logits(folder: Path) -> dict:
    # load_hf, not phaseinterp.load: the script records on the commit before a change too (0.2 had no load)
    from phaseinterp.models.hf import load_hf

    m = load_hf(folder)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, m.cfg.d_vocab, (3, min(m.cfg.n_ctx, 256)), generator=g)
    with torch.no_grad():
        return dict(full=m(tokens), final=m.last_logits(tokens))


if __name__ == "__main__":
    args = sys.argv[1:]
    slot = "--slot" in args
    args = [a for a in args if a != "--slot"]
    if len(args) != 1 or args[0] not in ("record", "compare"):
        sys.exit(f"usage: python {sys.argv[0]} record|compare [--slot] (got {sys.argv[1:]})")
    mode = args[0]
    names = None if mode == "record" else list(torch.load(OUT))
    hooks = [(lambda name: name.endswith("attn.hook_pattern"), lambda p, hook: p)] if slot else []
    res = run_all(names, hooks)
    if mode == "record":
        OUT.parent.mkdir(parents=True, exist_ok=True)
        torch.save(res, OUT)
        print("recorded", list(res))
    else:
        ref = torch.load(OUT)
        ok = True
        for name, d in ref.items():
            for k, t in d.items():
                new = res[name][k]
                same = torch.equal(t, new)
                diff = (t - new).abs().max().item()
                rel = diff / max(t.abs().max().item(), 1e-30)
                argmax = torch.equal(t.argmax(-1), new.argmax(-1))
                print(f"{name:20s} {k:5s} bit-identical={same} max|diff|={diff:.3e} relative={rel:.1e} "
                      f"argmax-identical={argmax}")
                # the bar: every prediction identical, logits within 1e-4 relative
                ok &= argmax and rel <= 1e-4
        for d in sorted(CK.iterdir()):
            if (d / "phaseinterp.json").is_file() and d.name in ref:
                from phaseinterp.models.hf import load_hf
                from phaseinterp.models.hf.against_hf import check_against_transformers

                m = load_hf(d)
                tokens = torch.randint(0, m.cfg.d_vocab, (3, min(m.cfg.n_ctx, 256)), generator=torch.Generator().manual_seed(0))
                print(f"{d.name:20s} against transformers: {check_against_transformers(m, tokens)}")
        print("ALL OK" if ok else "MISMATCH")
