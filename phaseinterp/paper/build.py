"""Write the published numbers of the paper's figures as phaseinterp's package data.

    python -m phaseinterp.paper.build [FIGDATA.json] [--out DIR]

reads the figure data of the paper's post (``figdata.json``; default ``../shared/paper/figdata.json``)
and writes tidy CSV tables to ``phaseinterp/paper/data/`` plus ``source.json`` (the input's and each
table's SHA-256). Only numbers and run labels are copied, as published (percent, pp). Tables: runs,
evaluations, profiles, knockouts, gates, cycling_runs, cycling, cycling_scores, concentration and
trajectory (``.csv``)."""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import math
from pathlib import Path

from phaseinterp._files import check_output_dir, write_dir_atomically
from phaseinterp.errors import UserInputError

SOURCE = {
    "repository": "UltimateJupiter/ultimatejupiter.github.io",
    "commit": "8b6a7a541e2ada09139f96374632e40311ea6507",
    "file": "blog-interactive/src/posts/periodic-weak-spots/data.js",
    "object": "window.FIGDATA (its JSON object, copied as figdata.json)",
}
HERE = Path(__file__).resolve().parent
DEFAULT_INPUT = HERE.parents[2] / "shared" / "paper" / "figdata.json"
Z = 1.959964  # the published Wilson intervals' z (two-sided 95%)
PADDINGS = {"pp": "prefix", "ip": "in-sequence"}


def _wilson(k: int, n: int) -> tuple[float, float]:
    p, den = k / n, 1 + Z * Z / n
    centre = (p + Z * Z / (2 * n)) / den
    half = Z * math.sqrt(p * (1 - p) / n + Z * Z / (4 * n * n)) / den
    return 100 * (centre - half), 100 * (centre + half)


def _baseline_n(profile: dict) -> int:
    """The one per-residue prompt count in 200..5000 whose Wilson intervals reproduce all 24 published
    bounds of a full-attention baseline (the export gives accuracies and intervals, not counts)."""
    fits = []
    for n in range(200, 5001):
        ok = True
        for acc, lo, hi in zip(profile["acc"], profile["lo"], profile["hi"]):
            k = round(acc / 100 * n)
            w_lo, w_hi = _wilson(k, n)
            if abs(100 * k / n - acc) > 0.05 or round(w_lo, 2) != lo or round(w_hi, 2) != hi:
                ok = False
                break
        if ok:
            fits.append(n)
    if len(fits) != 1:
        # internal: the published export pins exactly one count per profile; anything else means the export changed
        raise ValueError(f"{profile['id']}: {len(fits)} prompt counts reproduce its Wilson intervals ({fits[:5]}); "
                         "expected exactly one")
    return fits[0]


def tables(d: dict) -> tuple[dict[str, list[dict]], dict]:
    """The tables (name -> rows) and the derived facts recorded in source.json."""
    runs, evals, profiles, knockouts = [], [], [], []
    derived: dict = {}
    group_title = {g["key"]: g["title"] for g in d["runs"]["groups"]}
    for m in d["runs"]["models"]:
        runs.append(dict(id=m["id"], name=m["name"], kind="controlled", group=group_title[m["group"]], W=m["W"],
                         S=m["S"], kv_heads=m["kv"], layers=m["layers"], loss=m["loss"],
                         paper_panel=m.get("paper_panel") or "", stage="pre-trained", n_per_residue="",
                         prompt_tokens="", default=m["id"] == d["runs"]["default"]))
        for key, padding in PADDINGS.items():
            e = m[key]
            evals.append(dict(run=m["id"], padding=padding, mean=e["mean"][0], mean_lower=e["mean"][1],
                              mean_upper=e["mean"][2], gap=e["gap"][0], gap_lower=e["gap"][1], gap_upper=e["gap"][2],
                              worst=min(e["acc"]), best=max(e["acc"]),
                              interval="cluster_bootstrap"))
            for r in range(24):
                profiles.append(dict(run=m["id"], padding=padding, residue=r, accuracy=e["acc"][r], lower=e["lo"][r],
                                     upper=e["hi"][r], correct="", n=""))
            for row, values in enumerate(e["ko"]):
                knockouts.append(dict(run=m["id"], padding=padding, modulus=24, scope="kv_head",
                                      layer=row // m["kv"], kv_head=row % m["kv"],
                                      **{f"r{r}": values[r] for r in range(24)}))
    baseline_n = {}
    for t in d["acc"]["full"]:
        n = _baseline_n(t)
        baseline_n[t["id"]] = n
        runs.append(dict(id=t["id"], name=t["name"], kind="full attention", group="Full attention", W="", S="",
                         kv_heads=t["kv"], layers=28, loss=t["loss"], paper_panel="", stage="pre-trained",
                         n_per_residue=n, prompt_tokens="", default=False))
        evals.append(dict(run=t["id"], padding="prefix", mean=t["mean"], mean_lower="", mean_upper="", gap=t["gap"],
                          gap_lower="", gap_upper="", worst=min(t["acc"]), best=max(t["acc"]),
                          interval="wilson"))
        for r in range(24):
            profiles.append(dict(run=t["id"], padding="prefix", residue=r, accuracy=t["acc"][r], lower=t["lo"][r],
                                 upper=t["hi"][r], correct=round(t["acc"][r] / 100 * n), n=n))
    derived["baseline_n_per_residue"] = baseline_n
    for m in d["niah"]["models"]:
        runs.append(dict(id=m["id"], name=m["name"], kind="DeepSeek", group="DeepSeek needles (128K)", W="", S=m["S"],
                         kv_heads="", layers="", loss="", paper_panel="", stage=m["stage"], n_per_residue=m["n"],
                         prompt_tokens=d["niah"]["prompt_tokens"], default=False))
        evals.append(dict(run=m["id"], padding="needle", mean=m["mean"], mean_lower="", mean_upper="", gap=m["gap"],
                          gap_lower="", gap_upper="", worst=m["worst"], best=m["best"], interval="wilson"))
        for r in range(8):
            profiles.append(dict(run=m["id"], padding="needle", residue=r, accuracy=m["acc"][r], lower=m["lo"][r],
                                 upper=m["hi"][r], correct=m["correct"][r], n=m["n"]))
    # the knockout figure's two further maps: full attention (1 KV, kv_head units) and DeepSeek-V4-Flash-Base
    # (whole-layer attention output over a band of final query positions: layer units)
    for key, run, scope in (("full", "full_attn_1kv", "kv_head"), ("deepseek", "flash_base", "layer")):
        k = d["ko"][key]
        for row, values in enumerate(k["rel"]):
            knockouts.append(dict(run=run, padding="figure", modulus=k["cols"], scope=scope,
                                  layer=row // k["kv"], kv_head=row % k["kv"] if scope == "kv_head" else -1,
                                  **{f"r{r}": values[r] if r < k["cols"] else "" for r in range(24)}))
    gates = []
    for m in d["gates"]["models"]:
        for layer in range(m["layers"]):
            for h in range(m["kv"]):
                for r in range(m["S"]):
                    gates.append(dict(run=m["id"], mode=m["mode"], tied=m["tied"], layer=layer, kv_head=h, phase=r,
                                      key_gate=m["kg"][layer][h][r], value_gate=m["vg"][layer][h][r],
                                      knockout=m["ko"][layer][h][r]))
    derived["gate_highlight_layers"] = d["gates"]["highlight"]
    cyc_runs, cyc, cyc_scores = [], [], []
    for run in d["cyc"]["runs"]:
        S, clean = run["S"], run["clean"]
        cyc_runs.append(dict(id=run["id"], name=run["name"], S=S, kv_heads=run["kv"],
                             default=run["id"] == d["cyc"]["default"]["run"]))
        for r in range(S):
            cyc.append(dict(run=run["id"], shift=0, phase=r, observed=clean["acc"][r], lower=clean["lo"][r],
                            upper=clean["hi"][r], predicted=clean["acc"][r], predicted_change=0.0,
                            observed_change=0.0, boundary=r == S - 1))
        for c in run["conds"]:
            for r in range(S):
                cyc.append(dict(run=run["id"], shift=c["d"], phase=r, observed=c["obs"][r], lower=c["lo"][r],
                                upper=c["hi"][r], predicted=c["pred"][r], predicted_change=c["pc"][r],
                                observed_change=c["oc"][r], boundary=r in c["boundary"]))
            row = dict(run=run["id"], shift=c["d"])
            for key in ("r2x", "r2i", "r2a", "maeA", "maeI", "dAcc"):
                row.update({key: c[key][0], f"{key}_lower": c[key][1], f"{key}_upper": c[key][2]})
            row["accPct"] = c["accPct"]
            cyc_scores.append(row)
    derived["cycling_default"] = d["cyc"]["default"]
    conc, traj = [], []
    title = {i: g["title"] for g in d["conc"]["groups"] for i in g["ids"]}
    for m in d["conc"]["models"]:
        for j, (x, y) in enumerate(m["pts"]):
            conc.append(dict(run=m["id"], name=m["name"], group=title[m["id"]], W=m["W"], S=m["S"], kv_heads=m["kv"],
                             layers=m["layers"], layer=j // m["kv"], kv_head=j % m["kv"], static=x, per_window=y))
    for head in d["conc"]["traj"]["heads"]:
        for i, (x, y) in enumerate(head["path"]):
            traj.append(dict(run=d["conc"]["traj"]["run"], layer=head["layer"], point=i, static=x, per_window=y))
    derived["checkpoint_step"] = d["meta"]["checkpoint_step"]
    derived["export"] = d["meta"]["source"]
    return dict(runs=runs, evaluations=evals, profiles=profiles, knockouts=knockouts, gates=gates,
                cycling_runs=cyc_runs, cycling=cyc, cycling_scores=cyc_scores, concentration=conc,
                trajectory=traj), derived


def _csv(rows: list[dict]) -> bytes:
    buf = io.StringIO(newline="")
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: (repr(v) if isinstance(v, float) else v) for k, v in row.items()})
    return buf.getvalue().encode()


BUILT_BY = "python -m phaseinterp.paper.build"


def _is_previous_build(folder: Path) -> bool:
    """Whether ``folder`` holds this builder's own output (its source.json names the builder)."""
    try:
        source = json.loads((folder / "source.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(source, dict) and source.get("built_by") == BUILT_BY


def check_build_target(out) -> Path:
    """The write rule for the builder's ``out`` (before any work, creating nothing): a folder can be made
    there (`check_output_dir`) and it is new, empty, or a previous build's (its source.json names this
    builder: the builder's purpose is to regenerate it, replaced whole). Anything else (a file, the
    user's files, another saved object) is never replaced: a `UserInputError` naming it."""
    target = check_output_dir(out, "--out")
    if target.is_dir() and any(target.iterdir()) and not _is_previous_build(target):
        entries = sorted(p.name for p in target.iterdir())
        listed = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise UserInputError(f"--out={str(out)!r} is not empty and holds no previous build of the paper's tables (it "
                             f"has {listed}); pass a new or empty folder")
    return target


def build(figdata: Path, out: Path) -> dict:
    """Write every table and source.json to ``out``, whole and atomically (a temporary folder beside it,
    then one rename: `write_dir_atomically`); returns source.json's content. ``out`` must be new, empty
    or a previous build's folder (`check_build_target`): nothing else is replaced."""
    target = check_build_target(out)
    raw = Path(figdata).read_bytes()
    d = json.loads(raw.decode("utf-8"))
    built, derived = tables(d)
    blobs = {f"{name}.csv": _csv(rows) for name, rows in built.items()}
    digests = {name: dict(rows=len(built[name.removesuffix(".csv")]), sha256=hashlib.sha256(blob).hexdigest())
               for name, blob in blobs.items()}
    source = dict(SOURCE, figdata_sha256=hashlib.sha256(raw).hexdigest(), figdata_bytes=len(raw),
                  built_by=BUILT_BY, tables=digests,
                  units=dict(accuracy="percent, as published", change="percentage points",
                             knockout="relative accuracy change in percent, 100 (knockout - clean) / clean",
                             gates="gate mass at the phase over its uniform share (1 = uniform); value gate "
                                   "rolled by -1 as published (value_gate[r] belongs to phase r + 1)",
                             concentration="effective number of offsets (1..W)"),
                  derived=derived)
    blobs["source.json"] = (json.dumps(source, indent=1, ensure_ascii=False) + "\n").encode("utf-8")

    def write(folder: Path) -> None:
        for name, blob in blobs.items():
            (folder / name).write_bytes(blob)

    write_dir_atomically(target, write)
    return source


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m phaseinterp.paper.build", description=__doc__.split("\n")[0])
    parser.add_argument("figdata", nargs="?", default=str(DEFAULT_INPUT), help=f"default: {DEFAULT_INPUT}")
    parser.add_argument("--out", default=str(HERE / "data"), help="default: phaseinterp/paper/data")
    args = parser.parse_args(argv)
    source = build(Path(args.figdata), Path(args.out))
    for name, info in source["tables"].items():
        print(f"{name:22s} {info['rows']:6d} rows  {info['sha256'][:12]}")
    print(f"figdata.json sha256 {source['figdata_sha256']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
