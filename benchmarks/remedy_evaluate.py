"""python benchmarks/remedy_evaluate.py SEEDS...  -> compare_remedy over finished runs (stop_at=800), saved + printed."""
import sys, json
import torch
torch.set_num_threads(1)
from phaseinterp.experiments import compare_remedy
seeds = tuple(int(s) for s in sys.argv[1:])
r = compare_remedy("runs/remedy", seeds=seeds, stop_at=800)
r.save(f"runs/remedy/result_seeds{''.join(map(str, seeds))}")
pd = __import__("pandas"); pd.set_option("display.width", 200)
print(r.summary().to_string())
print(r.learned_steps().pivot_table(index=["variant", "seed"], columns="phase", values="step"))
pc = r.phase_curves().groupby(["variant", "step", "phase"]).accuracy.mean().unstack("phase")
print(pc.round(2).to_string())
print(r.memory.to_string())
