"""How much memory a DeepSeek-V4 checkpoint needs, counted from its config (no weights read).

The model is instantiated on PyTorch's ``meta`` device (shapes only), so the count is exact
for the architecture transformers builds from that config. Weight bytes = parameters x bytes
per parameter; the routed experts can be counted at another width (MXFP4 as released,
`FP4_EXPERT_BYTES`; FP8). ``phaseinterp memory-plan [config.json|DIR]`` prints the table (no argument: transformers' default ``DeepseekV4Config``, the V4-Flash shape).
"""

from __future__ import annotations

import json
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from phaseinterp._checks import check_int, check_real
from phaseinterp.errors import MissingPathError  # a missing path the user gave: one line, exit 2
from phaseinterp.models.hf.chunking import TOKEN_BLOCK, chunk_size, is_chunked
from phaseinterp.models.hf.config import config_from_dict, transformers_v4


# MXFP4 experts as released: half a byte per value plus one E8M0 scale byte per 32 values
FP4_EXPERT_BYTES = 0.5 + 1 / 32


@dataclass(frozen=True)
class MemoryEstimate:
    """Parameter counts and weight memory of one config (activations and KV cache not included)."""

    n_params: int
    n_expert_params: int  # routed experts (gate_up_proj, down_proj)
    n_layers: int

    @property
    def n_other_params(self) -> int:
        return self.n_params - self.n_expert_params

    def weight_gib(self, bytes_per_param: float = 2.0, expert_bytes_per_param: float | None = None) -> float:
        """Weights in GiB: ``bytes_per_param`` for everything, experts at ``expert_bytes_per_param`` if given."""
        bytes_per_param, expert_bytes_per_param = _check_widths(("bytes_per_param", bytes_per_param),
                                                                ("expert_bytes_per_param", expert_bytes_per_param))
        experts = self.n_expert_params * (bytes_per_param if expert_bytes_per_param is None else expert_bytes_per_param)
        return (self.n_other_params * bytes_per_param + experts) / 2**30

    def summary(self) -> dict[str, Any]:
        """Counts and GiB per storage width, by name (`format_estimate` prints them)."""
        return {"n_params": self.n_params, "n_expert_params": self.n_expert_params, "n_layers": self.n_layers,
                "bf16_gib": round(self.weight_gib(2.0), 1), "fp8_experts_bf16_rest_gib": round(self.weight_gib(2.0, 1.0), 1),
                "fp4_experts_bf16_rest_gib": round(self.weight_gib(2.0, FP4_EXPERT_BYTES), 1),
                "fp32_gib": round(self.weight_gib(4.0), 1)}


def _check_widths(*named: tuple[str, Any]) -> list[Any]:
    """Each ``(name, bytes per parameter)`` as a Python float > 0 (None kept: not given)."""
    return [None if value is None else check_real(name, value, 0.0, low_open=True, why=" (bytes per parameter)")
            for name, value in named]


def format_estimate(estimate: MemoryEstimate) -> str:
    """``name: value`` lines of ``estimate.summary()``, counts with thousands separators."""
    return "\n".join(f"{key}: {value:,}" if isinstance(value, int) else f"{key}: {value}"
                     for key, value in estimate.summary().items())


def estimate_memory(config: Union[str, Path, Any, None] = None) -> MemoryEstimate:
    """Count the parameters of a ``DeepseekV4Config`` (or its dict), a ``config.json`` path or a checkpoint
    directory (None: transformers' default config)."""
    config = _as_config(config)
    with torch.device("meta"):
        model = transformers_v4().DeepseekV4ForCausalLM(config)
    total = sum(p.numel() for p in model.parameters())
    experts = sum(p.numel() for n, p in model.named_parameters() if ".mlp.experts." in n)
    return MemoryEstimate(n_params=int(total), n_expert_params=int(experts), n_layers=int(config.num_hidden_layers))


# ---------------------------------------------------------------------------------------------
# Activations and KV cache at length T, and how many devices an experiment needs
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ForwardMemory:
    """Bytes for one full forward of the wrapper over ``batch`` x ``seq_len`` tokens (no KV cache:
    the experiments' path), the terms named, plus the KV cache a generating engine would keep.

    Peak = weights + persistent (the ``hc_mult`` residual streams and the per-token tensors a layer
    keeps) + the largest transient: the indexer's scores of one query chunk, the attention of one
    query chunk (`_chunked_terms`: the forward's attention is `attention.attend` per chunk, one chunk
    of every query where it is not chunked), the routed experts' intermediates of one token block, or
    the final logits ``[batch, T, vocab]``. Counted from reading the forward, not fitted.
    """

    seq_len: int
    batch: int
    weights: int
    persistent: int
    attention: int
    indexer: int
    logits: int
    kv_cache: int  # sliding window + compressed entries + indexer entries, all layers (generation)
    chunked: bool = False  # whether the forward runs chunked at this length (`chunking.is_chunked`)
    moe: int = 0  # the routed experts' intermediates of one token block

    @property
    def peak(self) -> int:
        # the indexer's chunk loop ends before the attention's begins; the MoE runs after both
        return self.weights + self.persistent + max(self.attention, self.indexer, self.moe, self.logits)

    def summary(self) -> dict[str, Any]:
        gib = lambda n: round(n / 2**30, 3)  # noqa: E731
        return {"seq_len": self.seq_len, "batch": self.batch, "weights_gib": gib(self.weights),
                "activations_gib": gib(self.peak - self.weights), "peak_gib": gib(self.peak),
                "kv_cache_gib": gib(self.kv_cache)}


def estimate_forward_memory(config: Union[str, Path, Any, None], seq_len: int, batch: int = 1,
                            act_bytes: int = 2, weight_bytes: float = 2.0,
                            expert_weight_bytes: float | None = None, query_chunk: Any = "auto",
                            logits: bool = True) -> ForwardMemory:
    """`ForwardMemory` of ``config`` at ``seq_len`` tokens: activations at ``act_bytes`` per value
    (2 = bf16; the indexer scores are fp32 whatever the dtype), weights as in `MemoryEstimate.weight_gib`.

    ``query_chunk``: the wrapper's setting (`HookedDeepseekV4.set_query_chunk`): the query chunks the
    attention runs in (`_chunked_terms`; ``None``: one chunk of every query). ``logits=False``: the final ``[batch, T, vocab]`` logits
    are not counted (`last_logits`, what `phase_profile` and the knockouts read)."""
    seq_len = check_int("seq_len", seq_len, 1)
    batch = check_int("batch", batch, 1)
    act_bytes = check_int("act_bytes", act_bytes, 1, why=" (bytes per activation value)")
    weight_bytes, expert_weight_bytes = _check_widths(("weight_bytes", weight_bytes),
                                                      ("expert_weight_bytes", expert_weight_bytes))
    cfg = _as_config(config)
    est = estimate_memory(cfg)
    weights = int(est.weight_gib(weight_bytes, expert_weight_bytes) * 2**30)
    T, B, a = seq_len, batch, act_bytes
    persistent, attention, indexer = _chunked_terms(cfg, T, B, a, T if query_chunk is None else query_chunk)
    # transformers' routed experts on one token block (`BlockHooks.forward`): per routed token the
    # fused gate-up output (2 I), both clamps, the activation and the product (4 I)
    moe = B * min(T, TOKEN_BLOCK) * cfg.num_experts_per_tok * 6 * cfg.moe_intermediate_size * a
    return ForwardMemory(seq_len=T, batch=B, weights=weights, persistent=persistent, attention=attention,
                         indexer=indexer, logits=B * T * cfg.vocab_size * a if logits else 0,
                         kv_cache=_kv_cache(cfg, T, B, a), chunked=is_chunked(query_chunk, T), moe=moe)


def _kv_cache(cfg: Any, T: int, B: int, a: int) -> int:
    """The KV cache a generating engine keeps: the sliding window, the compressed and indexer entries."""
    kinds = list(cfg.layer_types)
    entries = lambda kind: 0 if kind == "sliding_attention" else T // cfg.compress_rates[kind]  # noqa: E731
    window = min(T, cfg.sliding_window)
    kv = sum(B * (window + entries(k)) * cfg.head_dim * a for k in kinds)
    return kv + sum(B * entries(k) * cfg.index_head_dim * a for k in kinds if k == "compressed_sparse_attention")


def _chunked_terms(cfg: Any, T: int, B: int, a: int, query_chunk: Any = "auto") -> tuple[int, int, int]:
    """(persistent, attention phase, indexer phase) bytes of the chunked forward's largest layer, counted
    from reading `attention.AttentionHooks._attend` and `attention.attend`, `compressor.IndexerHooks.select` and
    `attention.BlockHooks.forward` (not fitted).

    Alive through a layer, per token: the streams entering it and those it builds (``2 hc D``), the mHC
    weights of the token blocks (``post``, ``comb``, float32), the collapsed input and its normed copy
    (``2 D``), ``q_residual``, the rotated ``q`` (``H d``) and ``K = V``; the rotary tables (main,
    compress, the indexer's queries: cos and sin). A CSA layer adds the indexer's rotated queries
    (``index_heads x index_head_dim``), its selection ``[T, top_k]`` (int64) and both entry sets.
    Then the larger of two phases: the indexer's scores of one query chunk (in transformers' scorer the
    matmul broadcasts the entries to a float32 ``[chunk, index_head_dim, entries]`` copy (batch > 1) beside its
    ``[chunk, index_heads, entries]`` output; then three float32 score copies: matmul, relu,
    weighting) or the
    attention of one query chunk (`attention.attend`: the gathered band, the entries (gathered per
    query where a CSA chunk's closed entries outnumber the top-k, else one shared copy), and two ``[heads, chunk, key_slots + 1]`` score blocks, as each step there frees the block
    before it: scores and logits, logits and probabilities) with the output ``z`` ``[T, H, d]``
    filling beside it."""
    H, D, d, hc = cfg.num_attention_heads, cfg.hidden_size, cfg.head_dim, cfg.hc_mult
    Hi, di, k, W = cfg.index_n_heads, cfg.index_head_dim, cfg.index_topk, cfg.sliding_window
    rope_half = int(d * cfg.partial_rotary_factor) // 2
    kinds = list(cfg.layer_types)
    csa = "compressed_sparse_attention" in kinds
    E = T // cfg.compress_rates["compressed_sparse_attention"] if csa else 0
    hca = [T // cfg.compress_rates[kind] for kind in kinds if kind == "heavily_compressed_attention"]
    per_token = 2 * hc * D * a + (hc + hc * hc) * 4 + 2 * D * a + (cfg.q_lora_rank + H * d + d) * a
    persistent = B * T * per_token + 6 * T * rope_half * 4
    if csa:
        persistent += B * E * (d + di) * a + B * T * Hi * di * a + B * T * min(k, E) * 8
    elif hca:
        persistent += B * max(hca) * d * a

    def chunk(per_query: int) -> int:
        return min(T, chunk_size(T, per_query, query_chunk))

    indexer = 0
    if csa and E:
        Ci = chunk(E * (Hi + 2))
        # transformers' scorer: matmul(q [B, C, Hi, di], entries [B, 1, di, E]) broadcasts the entries to
        # a float32 copy per query ([B, C, di, E]) beside its output where B > 1 (for B = 1 torch folds the
        # queries into one matrix product); then relu and the weighting (3 score copies)
        broadcast = B * Ci * E * di * 4 if B > 1 else 0
        indexer = max(broadcast + B * Ci * Hi * E * 4, 3 * B * Ci * Hi * E * 4)
    # the chunks `AttentionHooks._attend` runs (sized for the layer with the most key slots), then per chunk
    # `attend`'s keys: a CSA chunk whose closed entries outnumber the top-k gathers k entries per query,
    # any other chunk keeps one shared copy of its entries; beside them two score blocks
    slots = W + max([min(k, E)] + hca)
    C = chunk(max(H * (slots + 1), slots * d))
    S_csa = cfg.compress_rates["compressed_sparse_attention"] if csa else None
    biggest = 0
    for lo in _largest_chunks(T, C):
        hi = min(lo + C, T)
        n = hi - lo
        for kind_slots, entries_n, gathered in (
                [(W + min(k, E), min(E, hi // S_csa), min(E, hi // S_csa) > k)] if csa else []) + [
                (W + h, h, False) for h in hca]:
            keys = n * (kind_slots * d if gathered else W * d) + (0 if gathered else entries_n * d)
            biggest = max(biggest, keys + 2 * n * H * (kind_slots + 1))
        biggest = max(biggest, n * (W * d + 2 * H * (W + 1)))  # a sliding-window layer
    attention = B * biggest * a + B * T * H * d * a
    return persistent, attention, indexer


def _largest_chunks(T: int, C: int) -> list[int]:
    """The starts of the chunks of ``C`` queries over ``T`` among which `_chunked_terms`' largest block is:
    a chunk's blocks grow with its size and, at one size, with its end (a CSA chunk's closed entries,
    then its gathered top-k), so the last full chunk and the final one (two, not ``T / C``)."""
    return sorted({max(0, (T // C - 1) * C), (T - 1) // C * C})


def _as_config(config: Union[str, Path, Any, None]) -> Any:
    if config is None:
        return transformers_v4().DeepseekV4Config()
    if isinstance(config, dict):
        return config_from_dict(config)
    if isinstance(config, (str, Path)):
        path = Path(config)
        path = path / "config.json" if path.is_dir() else path
        if not path.is_file():
            raise MissingPathError(f"{path} does not exist (pass a config.json or a checkpoint directory)")
        return config_from_dict(json.loads(path.read_text()))
    return config


def measure_forward_peak(model: Any, tokens: Any) -> int:
    """Measured peak bytes of tensors alive during ``model(tokens)`` plus the model's weights: CUDA's
    ``max_memory_allocated`` (reset before), on CPU `measure_call_peak`."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters() if p.device.type != "meta")
    device = next(model.parameters()).device
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        with torch.no_grad():
            model(tokens.to(device))
        torch.cuda.synchronize(device)
        return weights + torch.cuda.max_memory_allocated(device) - base

    with torch.no_grad():
        return weights + measure_call_peak(lambda: model(tokens))


def measure_call_peak(fn) -> int:
    """Peak bytes of the tensor storage created during ``fn()`` and alive at once (CPU): every storage an
    op creates is counted from its creation until Python frees it (a ``TorchDispatchMode`` with
    weak-reference finalizers), the quantity ``torch.cuda.max_memory_allocated`` reports on CUDA."""
    state = {"live": 0, "peak": 0}
    seen: set[int] = set()

    def release(key: int, n: int) -> None:
        seen.discard(key)
        state["live"] -= n

    class _Track(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in torch.utils._pytree.tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.device.type != "meta":
                    storage = t.untyped_storage()
                    key = storage.data_ptr()
                    if key and key not in seen:
                        seen.add(key)
                        n = storage.nbytes()
                        state["live"] += n
                        state["peak"] = max(state["peak"], state["live"])
                        weakref.finalize(storage, release, key, n)
            return out

    with _Track():
        fn()
    return state["peak"]


DEVICE_SIZES_GB = (80, 141)  # H100/A100 80 GB, H200 141 GB (decimal GB, as sold)


def devices_needed(fm: ForwardMemory, device_gb: int, state: int = 0) -> Optional[int]:
    """Devices of ``device_gb`` GB for one forward keeping ``state`` bytes: whole decoder layers per
    device (accelerate does not split one), so the activation peak must fit on one device beside that
    device's share of the weights and the state. None when one layer's activations alone exceed a device."""
    device_gb = check_int("device_gb", device_gb, 1, why=" (decimal GB per device)")
    state = check_int("state", state, 0, why=" (bytes)")
    cap = device_gb * 10**9
    act = fm.peak - fm.weights
    if act >= cap:
        return None
    return max(1, -(-(fm.weights + state) // (cap - act)))


def ablation_state_bytes(config: Any, seq_len: int, batch: int = 1, act_bytes: int = 2) -> int:
    """Bytes the cached knockout sweep keeps, all layers: the prefix's cache (`models.hf.cache`: per
    layer K = V of the last ``sliding_window - 1`` positions, every compressed entry, and the
    compressor's per-token K = V and gate logits of the windows still open, CSA also the indexer's)
    and the answer position's streams entering each layer; plus the calibration means ``[layer, head,
    d_head]`` (float32). Linear in T through the entries only (T/4 per CSA layer)."""
    T, B = check_int("seq_len", seq_len, 1), check_int("batch", batch, 1)
    a = check_int("act_bytes", act_bytes, 1, why=" (bytes per activation value)")
    cfg = _as_config(config)
    total = 0
    for kind in cfg.layer_types:
        rate = cfg.compress_rates.get(kind) if kind != "sliding_attention" else None
        total += B * (cfg.hc_mult * cfg.hidden_size + (cfg.sliding_window - 1) * cfg.head_dim) * a
        if rate is None:
            continue
        csa = kind == "compressed_sparse_attention"
        pending = 2 * rate if csa else rate  # tokens of the open window (CSA: and the last closed one)
        halves = 2 if csa else 1
        total += B * ((T // rate) * cfg.head_dim + 2 * pending * halves * cfg.head_dim) * a
        if csa:
            total += B * ((T // rate) * cfg.index_head_dim + 2 * pending * 2 * cfg.index_head_dim) * a
    return total + cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * 4


def memory_plan(config: Union[str, Path, Any, None] = None, lengths: tuple[int, ...] = (131072, 1048576),
                expert_weight_bytes: float = FP4_EXPERT_BYTES) -> list[dict[str, Any]]:
    """Rows: per length and experiment (``"phase profile"``: one prompt's forward to the last position,
    `last_logits`; ``"one-layer ablation"``: the same plus the knockout's kept clean state and the
    calibration means), weights (MXFP4 routed experts as released, `FP4_EXPERT_BYTES`; BF16
    rest), the chunked forward's activation peak, the state, and the 80 GB / 141 GB devices needed
    (None: one layer's activations exceed a device). The weights and the state spread over the
    devices layer by layer; every device must also hold one layer's activation peak."""
    (expert_weight_bytes,) = _check_widths(("expert_weight_bytes", expert_weight_bytes))
    rows = []
    for T in lengths:
        fm = estimate_forward_memory(config, T, act_bytes=2, weight_bytes=2.0, expert_weight_bytes=expert_weight_bytes,
                                     logits=False)
        act = fm.peak - fm.weights
        for experiment, state in (("phase profile", 0), ("one-layer ablation", ablation_state_bytes(config, T))):
            row = {"tokens": T, "experiment": experiment, "weights_gb": fm.weights / 1e9, "activations_gb": act / 1e9,
                   "state_gb": state / 1e9, "kv_cache_gb": fm.kv_cache / 1e9}
            for size in DEVICE_SIZES_GB:
                row[f"devices_{size}gb"] = devices_needed(fm, size, state)
            rows.append(row)
    return rows
