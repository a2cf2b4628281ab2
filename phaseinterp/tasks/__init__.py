"""Phase-controlled tasks: key-value retrieval (`retrieval`), needle retrieval (`needle`, `text_needle`),
copying (`copying`) and identifier recall (`identifier`) in natural text, the docstring probe, the
moment-matching solver (`placement`), layout, splits, batches and the synthetic vocabulary (`vocab`)."""

from typing import Any

from phaseinterp._checks import check_is_model
from phaseinterp.errors import UserInputError
from phaseinterp.tasks.batches import TaskBatch, TrainBatch
from phaseinterp.tasks.copying import SpanCopy
from phaseinterp.tasks.identifier import IdentifierRecall
from phaseinterp.tasks.docstring import DocstringProbe, DocstringResult
from phaseinterp.tasks.needle import NeedleRetrieval, TokenPools
from phaseinterp.tasks.placement import TargetPlacement, exact_matching_possible, match_target_moments
from phaseinterp.tasks.retrieval import KeyValueRetrieval
from phaseinterp.tasks.text_needle import TextNeedle
from phaseinterp.tasks.splits import mapping_split
from phaseinterp.tasks.vocab import Tokenizer, Vocab

_TASKS = {cls.__name__: cls for cls in (KeyValueRetrieval, NeedleRetrieval, TextNeedle, SpanCopy, IdentifierRecall)}


def task_from_dict(d: dict[str, Any]) -> KeyValueRetrieval | NeedleRetrieval | SpanCopy | IdentifierRecall:
    """Rebuild a task stored with ``task.to_dict()`` (dispatches on its ``kind``)."""
    kind = d.get("kind")
    if kind not in _TASKS:
        raise UserInputError(f"kind={kind!r} is not a known task ({sorted(_TASKS)})")
    return _TASKS[kind].from_dict(d)


def resolve_task(model, task=None):
    """``task`` if given, else the evaluation task stored with the model (zoo checkpoints:
    ``model.metadata["task"]``, of type ``model.metadata["task_type"]``)."""
    check_is_model(model)
    if task is not None:
        return task
    metadata = getattr(model, "metadata", {})
    stored = metadata.get("task")
    if not isinstance(stored, dict):
        raise UserInputError(
            "no task given and the model has no stored evaluation task (model.metadata['task']); "
            "pass task=KeyValueRetrieval(...)"
        )
    kind = metadata.get("task_type", "KeyValueRetrieval")
    if kind not in _TASKS:
        raise UserInputError(f"stored task type {kind!r} is not a phaseinterp task (known: {sorted(_TASKS)})")
    return _TASKS[kind].from_dict(stored)


__all__ = ["DocstringProbe", "DocstringResult", "IdentifierRecall", "KeyValueRetrieval", "NeedleRetrieval", "SpanCopy",
           "TargetPlacement", "TextNeedle", "TaskBatch", "TokenPools", "Tokenizer", "TrainBatch", "Vocab",
           "exact_matching_possible", "mapping_split", "match_target_moments", "resolve_task", "task_from_dict"]
