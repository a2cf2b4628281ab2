"""Phase-controlled tasks: key-value retrieval, needle retrieval, the docstring probe, the synthetic vocabulary."""

from typing import Any

from phaseinterp.tasks.docstring import DocstringProbe, DocstringResult
from phaseinterp.tasks.needle import NeedleRetrieval, TokenPools
from phaseinterp.tasks.retrieval import (
    KeyValueRetrieval,
    TargetPlacement,
    TaskBatch,
    TrainBatch,
    exact_matching_possible,
    match_target_moments,
)
from phaseinterp.tasks.vocab import Tokenizer, Vocab

_TASKS = {cls.__name__: cls for cls in (KeyValueRetrieval, NeedleRetrieval)}


def task_from_dict(d: dict[str, Any]) -> KeyValueRetrieval | NeedleRetrieval:
    """Rebuild a task stored with ``task.to_dict()`` (dispatches on its ``kind``)."""
    kind = d.get("kind")
    if kind not in _TASKS:
        raise ValueError(f"kind={kind!r} is not a known task ({sorted(_TASKS)})")
    return _TASKS[kind].from_dict(d)


__all__ = [
    "DocstringProbe",
    "DocstringResult",
    "KeyValueRetrieval",
    "NeedleRetrieval",
    "TargetPlacement",
    "TaskBatch",
    "TokenPools",
    "Tokenizer",
    "TrainBatch",
    "Vocab",
    "exact_matching_possible",
    "match_target_moments",
    "task_from_dict",
]
