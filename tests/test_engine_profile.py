"""Issue 34 (first half): `engine_profile(engine, task)`, the phase profile from an engine's answers. A zoo
model served over HTTP by a local stand-in server gives records identical to the in-process profile; a server
that fails mid-run loses no answers (the resumed run completes with identical records); a Hugging
Face tokenizer's task reaches the engine as the very ids it laid out; bad inputs are refused."""

import http.server
import json
import socket
import threading

import numpy as np
import pandas as pd
import pytest
import torch

import phaseinterp as pi
from phaseinterp.engines import CacheEngine, OpenAIEngine, engine_profile
from phaseinterp.engines.answers import JOURNAL_FILE, engine_answers
from phaseinterp.errors import EngineError, UserInputError
from phaseinterp.profile import PhaseProfile, phase_profile

N = 72  # the smallest size the zoo task moment-matches (T = 128, R = 24): 1,728 prompts


@pytest.fixture(scope="module")
def w4s4():
    model = pi.zoo.load("w4s4")
    return model, pi.zoo.task_for(model)


@pytest.fixture(scope="module")
def in_process(w4s4):
    model, task = w4s4
    return phase_profile(model, task, n_per_residue=N, progress=False)


# ------------------------------------------------------------- the stand-in server
class StandIn:
    """A local /v1/completions server (stdlib ``http.server`` in a thread, as tests/test_conformance.py
    starts its stand-in) answering from ``model.last_logits`` in float32, the in-process profile's
    own computation, with the ``logprobs`` top-k it is asked for (keys ``"token_id:N"``).

    ``fail_after``: answer HTTP 503 to every request after that many; ``fail_once``: answer 503 to
    the first request only; ``fault``: "fewer_choices", "no_logprobs" or "text_only" (HTTP 500 with
    the validation error llama-cpp-python 0.3.36's server gives a token-id prompt). Every prompt it receives is
    kept in ``received`` (token-id lists)."""

    def __init__(self, model, fail_after=None, fail_once=False, fault=None):
        self.model, self.fail_after, self.fail_once, self.fault = model, fail_after, fail_once, fault
        self.requests, self.received, self.lock = 0, [], threading.Lock()
        stand_in = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - the stdlib's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with stand_in.lock:
                    stand_in.requests += 1
                    count = stand_in.requests
                    failing = (stand_in.fail_after is not None and count > stand_in.fail_after) or (
                        stand_in.fail_once and count == 1)
                    if not failing:
                        stand_in.received.extend(body["prompt"])
                if failing:
                    self.send_error(503, "restarting")
                    return
                if stand_in.fault == "text_only":
                    self._json({"error": {"message": "3 validation errors:\n  {'type': 'string_type', 'loc': "
                                          "('body', 'prompt', 'str'), 'msg': 'Input should be a valid string', "
                                          f"'input': {body['prompt'][0][:8]}"}}, status=500)
                    return
                self._json({"choices": stand_in.answer(body)})

            def _json(self, payload, status=200):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def answer(self, body):
        assert body["max_tokens"] == 1 and body["return_tokens_as_token_ids"] is True
        tokens = torch.tensor(body["prompt"])
        with torch.inference_mode():
            logprobs = torch.log_softmax(self.model.last_logits(tokens).float(), -1)
        choices = []
        for i, row in enumerate(logprobs):
            top = row.topk(body["logprobs"])
            entries = {f"token_id:{t}": v for t, v in zip(top.indices.tolist(), top.values.tolist())}
            logprobs_field = {"top_logprobs": [entries]} if self.fault != "no_logprobs" else None
            choices.append({"index": i, "text": "", "logprobs": logprobs_field})
        return choices[:1] if self.fault == "fewer_choices" else choices

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def serve(w4s4):
    started = []

    def start(**kwargs):
        started.append(StandIn(w4s4[0], **kwargs))
        return started[-1]

    yield start
    for s in started:
        s.close()


def engine_for(server, model, top_logprobs=None):
    d_vocab = model.cfg.d_vocab
    return OpenAIEngine(server.url, "w4s4", d_vocab=d_vocab, top_logprobs=top_logprobs or d_vocab)


def sent_prompts(batch):
    return [row[: int(p) + 1] for row, p in zip(batch.tokens.tolist(), batch.answer_pos)]


# ------------------------------------------------------------------ identical records
def test_served_zoo_model_profile_equals_the_in_process_profile(w4s4, in_process, serve):
    model, task = w4s4
    server = serve()
    served = engine_profile(engine_for(server, model), task, n_per_residue=N, stride=4, label=in_process.label, progress=False)
    pd.testing.assert_frame_equal(served.records, in_process.records, check_exact=True)
    assert served == in_process  # every statistic, the period test and the records
    assert served.to_dict() == in_process.to_dict()
    assert served.period == 4 and served.phase_gap > 0.5  # the real phase structure, not a flat profile
    batch = task.generate(N, seed=0)
    assert server.received == sent_prompts(batch)  # token ids as laid out, cut after the answer position
    assert server.requests == 1728 // 64


def test_top_k_engine_counts_an_unreported_answer_wrong(w4s4, in_process, serve):
    model, task = w4s4
    server = serve()
    served = engine_profile(engine_for(server, model, top_logprobs=3), task, n_per_residue=N, stride=4, label=in_process.label,
                           progress=False)
    mine, ref = served.records, in_process.records
    assert (mine["predicted"] == ref["predicted"]).all() and (mine["correct"] == ref["correct"]).all()
    reported = mine["answer_logprob"].notna().to_numpy()
    assert reported[ref["correct"].to_numpy()].all()  # a correct answer is the top-1: always reported
    assert not reported.all()  # some wrong answers fall outside the top 3
    np.testing.assert_array_equal(mine["answer_logprob"].to_numpy()[reported], ref["answer_logprob"].to_numpy()[reported])
    np.testing.assert_array_equal(served.residue_correct, in_process.residue_correct)


def test_in_process_engine_gives_the_same_correctness(w4s4, in_process):
    """`CacheEngine` (the full forward, no server) as the engine: same predictions; its log-probs come
    from another path (full forward vs last position), so they agree to 1e-5, not bit for bit."""
    model, task = w4s4
    every = slice(0, 1728, 36)  # 2 prompts per residue (the full forward at every position is slow)
    served = engine_profile(CacheEngine(model), task.generate(N, seed=0).subset(every), stride=4, progress=False)
    assert served.label == "reference"
    ref = in_process.records.iloc[every].reset_index(drop=True)
    assert (served.records["predicted"] == ref["predicted"]).all()
    np.testing.assert_allclose(served.records["answer_logprob"], ref["answer_logprob"], atol=1e-4)


# ------------------------------------------------------------------ failures and resuming
def test_server_failing_mid_run_resumes_with_identical_records(w4s4, in_process, serve, tmp_path):
    model, task = w4s4
    journal = tmp_path / "answers"
    failing = serve(fail_after=10)
    with pytest.raises(EngineError, match=r"failed on prompts 640\.\.703 2 times .*HTTP 503.*640 of 1728 answers "
                                          r"are kept in"):
        engine_profile(engine_for(failing, model), task, n_per_residue=N, stride=4, resume_dir=journal, retries=1,
                       retry_wait=0.0, progress=False)
    assert len(list((journal / "answers").glob("batch-*.npz"))) == 10 and (journal / JOURNAL_FILE).is_file()
    restarted = serve()  # the server comes back (on another port): same model name, same prompts
    resumed = engine_profile(engine_for(restarted, model), task, n_per_residue=N, stride=4, label=in_process.label,
                             resume_dir=journal, progress=False)
    assert restarted.requests == 27 - 10  # only the batches not yet answered
    assert restarted.received == sent_prompts(task.generate(N, seed=0))[640:]
    pd.testing.assert_frame_equal(resumed.records, in_process.records, check_exact=True)
    assert resumed == in_process


def test_a_transient_failure_is_retried(w4s4, serve, monkeypatch):
    from phaseinterp.engines import answers as answers_module

    model, _ = w4s4
    batch = pi.zoo.task_for(model).generate(N, seed=0).subset(slice(0, 8))
    server = serve(fail_once=True)
    waits = []
    monkeypatch.setattr(answers_module.time, "sleep", waits.append)  # the retry's wait, recorded, not slept
    answers = engine_answers(engine_for(server, model), batch, retries=2, retry_wait=0.5, progress=False)
    assert waits == [0.5] and server.requests == 2 and len(answers.predicted) == 8


def test_resume_dir_of_another_run_is_refused(w4s4, serve, tmp_path):
    model, task = w4s4
    batch = task.generate(N, seed=0)
    server = serve()
    engine_answers(engine_for(server, model), batch.subset(slice(0, 8)), resume_dir=tmp_path, progress=False)
    with pytest.raises(UserInputError, match="holds the answers of another run: field 'n_prompts' differs"):
        engine_answers(engine_for(server, model), batch.subset(slice(0, 16)), resume_dir=tmp_path, progress=False)
    with pytest.raises(UserInputError, match="field 'batch_size' differs"):
        engine_answers(engine_for(server, model), batch.subset(slice(0, 8)), resume_dir=tmp_path, batch_size=4,
                       progress=False)


# ------------------------------------------------------------------ bad inputs
def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_server_is_a_clear_error(w4s4, tmp_path):
    model, task = w4s4
    engine = OpenAIEngine(f"http://127.0.0.1:{_closed_port()}", "w4s4", d_vocab=model.cfg.d_vocab)
    with pytest.raises(EngineError, match=r"cannot reach http://127\.0\.0\.1:\d+/v1/completions.*0 of 1728 answers "
                                          "are kept"):
        engine_profile(engine, task, n_per_residue=N, stride=4, retries=1, retry_wait=0.0, resume_dir=tmp_path,
                       progress=False)


@pytest.mark.parametrize("fault, message", [
    ("fewer_choices", "returned 1 choices for 64 prompts"),
    ("no_logprobs", "returned no top_logprobs for prompt 0"),
    ("text_only", r"does not take token-id prompts .*vLLM, SGLang.*LlamaCppEngine.*HTTP 500"),
])
def test_server_protocol_faults_are_user_input_errors(w4s4, serve, fault, message):
    model, task = w4s4
    server = serve(fault=fault)
    with pytest.raises(UserInputError, match=message + r".*0 of 1728 answers had been received"):
        engine_profile(engine_for(server, model), task, n_per_residue=N, stride=4, progress=False)
    assert server.requests == 1  # not retried: the same request would fail the same way


@pytest.mark.parametrize("url", ["localhost:8000", "http://", "http://host:notaport", "ftp://host",
                                 "http://host:8000/?q=1"])
def test_bad_url_is_refused(url):
    with pytest.raises(UserInputError, match="base_url="):
        OpenAIEngine(url, "m", d_vocab=10)


def test_engine_needs_a_stride_and_no_device(w4s4):
    model, task = w4s4
    engine = CacheEngine(model)
    with pytest.raises(UserInputError, match="needs stride="):
        engine_profile(engine, task, n_per_residue=N, progress=False)
    with pytest.raises(UserInputError, match="device='cpu' does not apply to an engine"):
        engine_profile(engine, task, n_per_residue=N, stride=4, device="cpu", progress=False)
    with pytest.raises(TypeError, match="unexpected keyword argument 'resume_dir'"):  # engine_profile's option
        phase_profile(model, task, n_per_residue=N, resume_dir="x", progress=False)


# ------------------------------------------------------------------ a Hugging Face tokenizer
def word_level_tokenizer(words):
    """A Hugging Face fast tokenizer over ``words`` (ids in that order), built here: no download."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", pad_token="<pad>")


def needle_task():
    from phaseinterp.tasks import NeedleRetrieval

    return NeedleRetrieval(seq_len=128, n_records=20, key_tokens=1, value_tokens=1, n_demos=1, residue_modulus=4,
                           target_window=48, filler_tokens=24, separator="<sep>")


def test_needle_task_from_a_hugging_face_tokenizer_reaches_the_engine_as_laid_out(w4s4, serve):
    model, _ = w4s4
    vocab = pi.tasks.Vocab.default()
    tokenizer = word_level_tokenizer(vocab.tokens)  # the zoo vocabulary's words, as a real HF tokenizer
    task = needle_task()
    batch = task.generate(6, seed=3, tokenizer=tokenizer)
    # the pools are the tokenizer's ids of " cat", " Ada", " the", ...: here equal to the zoo vocabulary's
    assert set(batch.tokens[:, 1:].flatten().tolist()) <= set(vocab.key_ids + vocab.value_ids + vocab.filler_ids
                                                            + (vocab.sep_id,))
    assert (batch.tokens[:, 0] == tokenizer.bos_token_id).all()
    text = tokenizer.decode(batch.tokens[0].tolist())
    assert tokenizer.encode(text, add_special_tokens=False) == batch.tokens[0].tolist()  # the ids round-trip
    server = serve()
    profile = engine_profile(engine_for(server, model, top_logprobs=5), task, n_per_residue=6, seed=3, stride=4,
                            tokenizer=tokenizer, progress=False)
    assert server.received == sent_prompts(batch)  # no re-tokenization: the ids sent are the ids laid out
    assert profile.modulus == 4 and int(profile.residue_n.sum()) == 24
    assert (profile.records["answer"].to_numpy() == batch.answer.numpy()).all()


def test_a_tokenizer_that_does_not_match_the_engine_is_refused_before_any_request(w4s4, serve):
    model, _ = w4s4
    vocab = pi.tasks.Vocab.default()
    server = serve()
    engine = engine_for(server, model, top_logprobs=5)
    bigger = word_level_tokenizer(vocab.tokens + ("<unk>",))  # 109 tokens for a 108-token model
    with pytest.raises(UserInputError, match="the tokenizer has 109 tokens but engine 'openai:w4s4' has d_vocab=108"):
        engine_profile(engine, needle_task(), n_per_residue=6, stride=4, tokenizer=bigger, progress=False)
    # a task laid out by a 108-token tokenizer, sent to an engine whose model has 60 tokens
    batch = needle_task().generate(6, seed=0, tokenizer=word_level_tokenizer(vocab.tokens))
    small = OpenAIEngine(server.url, "w4s4", d_vocab=60, top_logprobs=5)
    with pytest.raises(UserInputError, match=r"token id \d+ of the task is out of range for engine 'openai:w4s4''s "
                                             r"d_vocab=60 \(0\.\.59\)"):
        engine_profile(small, batch, stride=4, progress=False)
    assert server.requests == 0


# ------------------------------------------------------------------ the command line
def _main(args):
    from phaseinterp.cli import main

    return main(args)


@pytest.mark.slow  # two 1,728-prompt profiles through the CLI (~20 s on the 2-core machine)
def test_cli_profile_against_an_engine_writes_the_in_process_folder(w4s4, serve, tmp_path):
    server = serve()
    assert _main(["profile", "w4s4", "--n-per-residue", "72", "--out", str(tmp_path / "here")]) == 0
    assert _main(["profile", "w4s4", "--engine", server.url, "--model-name", "w4s4", "--top-logprobs", "108",
                  "--n-per-residue", "72", "--shard-dir", str(tmp_path / "journal"),
                  "--out", str(tmp_path / "served")]) == 0
    here, served = PhaseProfile.load(tmp_path / "here"), PhaseProfile.load(tmp_path / "served")
    assert served == here and served.label == here.label == "w4s4 (W4/S4 gated)"
    assert json.loads((tmp_path / "served" / "meta.json").read_text()) == json.loads(
        (tmp_path / "here" / "meta.json").read_text())
    assert len(list((tmp_path / "journal" / "answers").glob("batch-*.npz"))) == 27


def separator_tokenizer(words):
    """`word_level_tokenizer` that also reads the needle task's paragraph break as ``<sep>``."""
    from tokenizers import normalizers

    fast = word_level_tokenizer(words)
    fast.backend_tokenizer.normalizer = normalizers.Replace("\n\n", " <sep> ")
    return fast


def test_cli_profile_with_a_tokenizer_sends_the_ids_it_laid_out(w4s4, serve, tmp_path):
    from phaseinterp.tasks import NeedleRetrieval

    tokenizer = separator_tokenizer(pi.tasks.Vocab.default().tokens)
    tokenizer.save_pretrained(tmp_path / "tok")
    server = serve()
    assert _main(["profile", "--engine", server.url, "--model-name", "w4s4", "--tokenizer", str(tmp_path / "tok"),
                  "--stride", "4", "--seq-len", "128", "--n-per-residue", "42", "--top-logprobs", "5",
                  "--out", str(tmp_path / "p")]) == 0
    batch = NeedleRetrieval(seq_len=128).generate(42, seed=0, tokenizer=tokenizer)
    assert server.received == sent_prompts(batch)
    loaded = PhaseProfile.load(tmp_path / "p")
    assert loaded.label == "openai:w4s4" and int(loaded.residue_n.sum()) == 42 * 24
    assert (loaded.records["answer"].to_numpy() == batch.answer.numpy()).all()


@pytest.mark.parametrize("args, message", [
    (["--engine", "localhost:8000", "--model-name", "m", "w4s4"], "base_url='localhost:8000' must start with http"),
    (["--engine", "http://127.0.0.1:9", "w4s4"], "--engine needs --model-name NAME"),
    (["--engine", "http://127.0.0.1:9", "--model-name", "m"], "pass exactly one"),
    (["--engine", "http://127.0.0.1:9", "--model-name", "m", "--tokenizer", "/nonexistent/tok", "--stride", "4"],
     "--tokenizer='/nonexistent/tok' does not exist"),
    (["--engine", "http://127.0.0.1:9", "--model-name", "m", "--tokenizer", "/tmp"], "--tokenizer needs --stride S"),
    ([], "profile needs MODEL"),
])
def test_cli_engine_bad_arguments_exit_2_in_one_line(args, message, capsys):
    assert _main(["profile", *args, "--n-per-residue", "72"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and err.count("\n") == 0, err


def test_cli_unreachable_server_exits_2_in_one_line(capsys, tmp_path):
    url = f"http://127.0.0.1:{_closed_port()}"
    assert _main(["profile", "w4s4", "--engine", url, "--model-name", "w4s4", "--retries", "0", "--n-per-residue",
                  "72", "--shard-dir", str(tmp_path / "j")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("phaseinterp: error: engine 'openai:w4s4' failed on prompts 0..63 1 times") and \
        "cannot reach" in err and "0 of 1728 answers are kept in" in err and err.count("\n") == 0, err
