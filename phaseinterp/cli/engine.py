"""``phaseinterp profile --engine URL --model-name NAME``: `phaseinterp.engine_profile` over an `OpenAIEngine`.
The task comes from MODEL (its stored task, vocabulary size, stride and label) or from ``--tokenizer DIR``
(a `NeedleRetrieval` in that tokenizer's ids; ``--stride`` then required)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from transformers import AutoTokenizer

from phaseinterp._files import check_output_dir
from phaseinterp.cli.args import UsageError
from phaseinterp.engines import OpenAIEngine, engine_profile
from phaseinterp.models import loading
from phaseinterp.models.loading import check_source, peek
from phaseinterp.profile import ProfileSpec
from phaseinterp.report import model_label
from phaseinterp.tasks import NeedleRetrieval, resolve_task


def _tokenizer(directory: str):
    path = Path(directory)
    if not path.is_dir():
        raise FileNotFoundError(f"--tokenizer {directory!r} is not a directory (a Hugging Face tokenizer folder: "
                                "tokenizer.json or the files save_pretrained writes)")
    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as err:
        raise UsageError(f"--tokenizer {directory!r} holds no readable tokenizer ({' '.join(str(err).split())[:200]})") \
            from None


def served_profile(args) -> int:
    """Run ``phaseinterp profile`` against ``--engine`` (every argument checked before a request)."""
    if args.engine is None:
        raise UsageError("profile needs MODEL (a zoo name or checkpoint directory), or --engine URL --model-name NAME")
    if not args.model_name:
        raise UsageError("--engine needs --model-name NAME: the model name the server serves (its /v1/models id)")
    if (args.model is None) == (args.tokenizer is None):
        raise UsageError("--engine takes the task from MODEL (a zoo name or checkpoint directory: its task, "
                         "vocabulary and stride) or from --tokenizer DIR (a needle task in that tokenizer's ids); "
                         "pass exactly one")
    if args.shard_dir is not None:
        check_output_dir(args.shard_dir)
    # the URL, then the model name among those the server lists (when it lists them), before anything loads
    OpenAIEngine(args.engine, args.model_name, d_vocab=1).check_model_name(name="--model-name")
    tokenizer, label = None, args.label
    if args.tokenizer is not None:
        if args.stride is None:
            raise UsageError("--tokenizer needs --stride S: the compression stride of the served model")
        if args.padding is not None:
            raise UsageError("--padding applies to MODEL's stored task; the needle task pads in sequence")
        task = NeedleRetrieval(seq_len=args.seq_len)
        stride = args.stride
        spec = ProfileSpec.from_args(args, batch_size=args.chunk_size)
        spec.check_task(task, stride)
        tokenizer = _tokenizer(args.tokenizer)
        task.placement(spec.n_per_residue, tokenizer, strict=True)
        d_vocab = args.d_vocab or len(tokenizer)
    else:
        check_source(args.model, name="MODEL")
        described = peek(args.model)
        if described is None:  # not readable from config.json alone: its config is read by loading it
            described = loading.load(args.model)
        task = resolve_task(described)
        if args.padding:
            task = replace(task, padding=args.padding)
        own = described.cfg.stride
        if args.stride is not None and getattr(described.cfg, "is_compressed", False) and args.stride != own:
            raise UsageError(f"--stride {args.stride} is not {args.model}'s own stride S={own}: omit --stride")
        stride = args.stride or own
        spec = ProfileSpec.from_args(args, batch_size=args.chunk_size)
        spec.check_task(task, stride)
        task.placement(spec.n_per_residue, strict=True)
        if args.d_vocab is not None and args.d_vocab < described.cfg.d_vocab:
            raise UsageError(f"--d-vocab {args.d_vocab} is smaller than {args.model}'s vocabulary ({described.cfg.d_vocab} "
                             "tokens): its task's answers would lie outside the served vocabulary; omit --d-vocab or pass "
                             f"at least {described.cfg.d_vocab}")
        d_vocab = args.d_vocab or described.cfg.d_vocab
        label = label or model_label(described)
    engine = OpenAIEngine(args.engine, args.model_name, d_vocab=d_vocab, top_logprobs=args.top_logprobs,
                          timeout=args.timeout,
                          token_to_id=None if tokenizer is None else tokenizer.convert_tokens_to_ids)
    result = engine_profile(engine, task, spec=spec.replace(stride=stride, label=label), resume_dir=args.shard_dir,
                            retries=args.retries, tokenizer=tokenizer)
    print(result.summary().to_string(header=False))
    if args.out:
        overwrite = {"overwrite": True} if getattr(args, "overwrite", False) else {}
        print(f"saved to {result.save(Path(args.out), **overwrite)}")
    return 0
