"""`engine_profile`: the phase profile of a served model, from its answers (`phaseinterp.engines.answers`)."""

from __future__ import annotations

import os
from typing import Any

import torch

from phaseinterp._checks import DEFAULT_N_PER_RESIDUE, experiment
from phaseinterp.engines.answers import check_engine, check_ids_fit, engine_answers
from phaseinterp.errors import UserInputError
from phaseinterp.profile import PhaseProfile, ProfileSpec, TwoAxisProfile, records_frame


@experiment(ProfileSpec)
def engine_profile(
    engine: Any,
    task: Any,
    *,
    n_per_residue: int = DEFAULT_N_PER_RESIDUE,
    seed: int = 0,
    batch_size: int = 64,
    device: str | torch.device | None = None,
    stride: int | None = None,
    label: str | None = None,
    confidence: float = 0.95,
    interval: str = "auto",
    n_bootstrap: int = 2000,
    n_permutations: int = 1999,
    progress: bool = True,
    axis: str = "target",
    hold: int | None = None,
    length_modulus: int | None = None,
    tokenizer: Any = None,
    resume_dir: str | os.PathLike | None = None,
    retries: int = 3,
    retry_wait: float = 1.0,
    spec: ProfileSpec | None = None,
) -> PhaseProfile | TwoAxisProfile:
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
