"""`engine_profile`: the phase profile of a served model, from its answers (`phaseinterp.engines.answers`)."""

from __future__ import annotations

import dataclasses
import inspect
import os
from typing import Any

from phaseinterp._checks import experiment
from phaseinterp.engines.answers import check_engine, check_ids_fit, engine_answers
from phaseinterp.errors import UserInputError
from phaseinterp.profile import PhaseProfile, ProfileSpec, TwoAxisProfile, records_frame


def _takes_options(fn):
    """``fn`` whose ``**options`` are `ProfileSpec`'s fields, keyword-only with their declared defaults
    (``fn.__signature__``, which `experiment`, ``help()`` and the sharded runs read): the options are
    declared once, on `phaseinterp._checks.ProfileOptions`."""
    signature = inspect.signature(fn)
    own = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
    first = next(i for i, p in enumerate(own) if p.kind is p.KEYWORD_ONLY)
    options = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
               for f in dataclasses.fields(ProfileSpec)]
    fn.__signature__ = signature.replace(parameters=own[:first] + options + own[first:])
    return fn


@experiment(ProfileSpec)
@_takes_options
def engine_profile(engine: Any, task: Any, *, tokenizer: Any = None, resume_dir: str | os.PathLike | None = None,
                   retries: int = 3, retry_wait: float = 1.0, spec: ProfileSpec | None = None,
                   **options: Any) -> PhaseProfile | TwoAxisProfile:
    """`phase_profile` of the model behind ``engine``, from its answers (`phaseinterp.engines.answers`:
    the prediction is the argmax of the reported log-probs, ties to the lowest id; an answer outside a
    reported top-k is wrong, its ``answer_logprob`` NaN).

    The options are `phase_profile`'s (a `ProfileSpec`), with ``stride`` required, ``device`` refused and
    ``label`` defaulting to ``engine.name``. Its own: ``resume_dir`` (a journal of finished batches; a
    rerun asks only for the rest), ``retries`` / ``retry_wait`` (further tries of a failing batch, waiting
    ``retry_wait * 2**k`` seconds, at most 60) and ``tokenizer`` (passed to ``task.generate``; its size
    must not exceed the engine's ``d_vocab``)."""
    name = check_engine(engine)
    if task is None:
        raise UserInputError("engine_profile(engine, task) needs task=: an engine stores no evaluation task "
                             "(e.g. task=phaseinterp.zoo.task_for(model) or a KeyValueRetrieval)")
    if spec.device is not None:
        raise UserInputError(f"device={spec.device!r} does not apply to an engine (it runs where it is served); drop it")
    if spec.stride is None:
        raise UserInputError(f"engine_profile needs stride=: the compression stride S of the model behind {name!r} "
                             "(an engine does not report it)")
    d_vocab = getattr(engine, "d_vocab", None)
    size = len(tokenizer) if tokenizer is not None and hasattr(tokenizer, "__len__") else None
    if d_vocab is not None and size is not None and size > d_vocab:
        raise UserInputError(f"the tokenizer has {size} tokens but engine {name!r} has d_vocab={d_vocab}: it is not "
                             "the served model's tokenizer (its ids could fall outside the model's vocabulary)")
    batch = spec.prompts(task, spec.stride, tokenizer)
    check_ids_fit(batch, d_vocab, f"engine {name!r}")
    answers = engine_answers(engine, batch, batch_size=spec.batch_size, resume_dir=resume_dir, retries=retries,
                             retry_wait=retry_wait, progress=spec.progress)
    records = records_frame(batch, spec.stride, answers.predicted, answers.answer_logprob)
    return spec.result(records, batch.residue_modulus, spec.stride, name if spec.label is None else spec.label)
