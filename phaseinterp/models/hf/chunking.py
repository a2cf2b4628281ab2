"""Long prompts on `HookedDeepseekV4`: when a forward runs in query chunks, and how large they are.

The attention (`attention.attend`) and the indexer's selection run in query chunks: under
``query_chunk="auto"`` (`HookedDeepseekV4.set_query_chunk`) as many queries per chunk as keep its
largest block *per prompt row* (the chunk's scores over its key slots, the gathered band keys, the
indexer's per-head scores) within SCORE_BLOCK elements (LONG_SCORE_BLOCK above AUTO_CHUNK_ABOVE
tokens), so a short prompt on a small model is one chunk; an integer: that many queries; ``None``:
one chunk. The chunks are a function of the prompt length, the model's geometry and the setting,
**never of the batch size**: a per-query hook (``hook_attn_scores``, ``hook_pattern``, the indexer's
``hook_scores``) sees the same query ranges (``hook.ctx["query_range"]``) for one prompt alone or
in a batch of 512, and a block's memory grows with the batch. Above AUTO_CHUNK_ABOVE tokens
(`is_chunked`) the MLP/MoE and the hyper-connections also run in blocks of TOKEN_BLOCK tokens.
"""

from __future__ import annotations


AUTO_CHUNK_ABOVE = 2048
SCORE_BLOCK = 1 << 24
LONG_SCORE_BLOCK = 1 << 21
TOKEN_BLOCK = 4096


def is_chunked(query_chunk, T: int) -> bool:
    """Whether a ``T``-token forward runs the chunked attention under ``query_chunk``."""
    if query_chunk is None:
        return False
    return T > AUTO_CHUNK_ABOVE if query_chunk == "auto" else True


def chunk_size(T: int, per_query: int, query_chunk) -> int:
    """Queries per chunk: ``query_chunk`` (an int), or under "auto" as many as keep ``per_query *
    queries`` within SCORE_BLOCK elements (LONG_SCORE_BLOCK above AUTO_CHUNK_ABOVE tokens), at least one.
    ``per_query`` is one prompt row's elements per query: callers never multiply it by the batch."""
    if isinstance(query_chunk, int):
        return query_chunk
    block = LONG_SCORE_BLOCK if is_chunked(query_chunk, T) else SCORE_BLOCK
    return max(1, block // max(1, per_query))


def chunk_ranges(T: int, per_query: int, query_chunk) -> list[tuple[int, int]]:
    """Query ranges ``[(a, b), ...]`` covering ``0..T-1``, `chunk_size` queries each (``per_query``:
    elements per query of one prompt row, so the ranges do not depend on the batch)."""
    size = chunk_size(T, per_query, query_chunk)
    return [(a, min(a + size, T)) for a in range(0, T, size)]


__all__ = ["AUTO_CHUNK_ABOVE", "LONG_SCORE_BLOCK", "SCORE_BLOCK", "TOKEN_BLOCK", "chunk_ranges",
           "chunk_size", "is_chunked"]
