"""The zoo's task: the one retrieval task every zoo model of both families is trained and measured on
(keyword arguments of `phaseinterp.tasks.KeyValueRetrieval`; a recipe may override some)."""

from __future__ import annotations

from typing import Any

TASK: dict[str, Any] = dict(seq_len=128, n_records=32, n_demos=4, residue_modulus=24, padding="in_sequence")
