"""Record/compare every task's generated data (bit-identity across the tasks/ split).

python benchmarks/task_data_identity.py record|compare  (reference in the git-ignored runs/issue11/)
"""
import sys
from pathlib import Path
import numpy as np
import torch
from phaseinterp.tasks import KeyValueRetrieval, NeedleRetrieval, Vocab

OUT = Path("runs/issue11/tasks_ref.pt")


class WordTokenizer:
    def __init__(self, words):
        self.words = ["<s>"] + list(words)
        self.index = {w: i for i, w in enumerate(self.words)}
        self.bos_token_id = 0

    def encode(self, text):
        return [self.index[w] for w in text.split()]


def flat(batch):
    d = {"tokens": batch.tokens, "answer": batch.answer, "answer_pos": batch.answer_pos,
         "meta": batch.meta.to_csv(), "moments": batch.moments.to_csv()}
    if getattr(batch, "answer_tokens", None) is not None:
        d["answer_tokens"] = batch.answer_tokens
    return d


def run():
    out = {}
    for pad in ("prefix", "in_sequence"):
        t = KeyValueRetrieval(padding=pad)
        out[f"kv_{pad}_gen"] = flat(t.generate(72, seed=3, stride=4))
        out[f"kv_{pad}_gen_map"] = flat(t.generate(72, seed=1, n_mappings=30))
        out[f"kv_{pad}_gen_smoke"] = flat(t.generate(4, seed=0, strict=False))
        out[f"kv_{pad}_cal"] = flat(t.calibration(200, seed=2))
        tb = t.sample_train(16, 5, n_records=(4, 24), n_queries=None)
        out[f"kv_{pad}_train"] = {k: getattr(tb, k) for k in ("tokens", "targets", "answer_mask", "value_mask", "n_records")}
        tb = t.sample_train(8, np.random.default_rng(7), n_records=10, n_queries=5, query_distance=(3, 12))
        out[f"kv_{pad}_train2"] = {k: getattr(tb, k) for k in ("tokens", "targets", "answer_mask", "value_mask", "n_records")}
    small = KeyValueRetrieval(seq_len=64, n_records=8, n_demos=2, min_distance=20, residue_modulus=8)
    out["kv_small"] = flat(small.generate(3, seed=0, strict=False))
    out["kv_small_cal"] = flat(small.calibration(24, seed=0))
    for pad in ("prefix", "in_sequence"):
        n = NeedleRetrieval(seq_len=512, padding=pad)
        out[f"needle_{pad}"] = flat(n.generate(72, seed=0, stride=4))
        out[f"needle_{pad}_cal"] = flat(n.calibration(48, seed=1))
    vocab = Vocab.default()
    tok = WordTokenizer(vocab.keys + vocab.values + vocab.fillers + ("|",))
    n = NeedleRetrieval(seq_len=600, separator="|")
    out["needle_tok"] = flat(n.generate(72, seed=1, tokenizer=tok))
    out["needle_tok_cal"] = flat(n.calibration(24, seed=0, tokenizer=tok))
    return out


if __name__ == "__main__":
    res = run()
    if sys.argv[1] == "record":
        OUT.parent.mkdir(parents=True, exist_ok=True)
        torch.save(res, OUT)
        print("recorded", len(res))
    else:
        ref = torch.load(OUT)
        bad = 0
        for name, d in ref.items():
            for k, v in d.items():
                w = res[name][k]
                same = torch.equal(v, w) if isinstance(v, torch.Tensor) else v == w
                if not same:
                    bad += 1
                    print("DIFF", name, k)
        print("ALL IDENTICAL" if not bad else f"{bad} DIFFERENCES", len(ref), "batches")
