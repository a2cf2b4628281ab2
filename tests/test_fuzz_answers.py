"""The fuzzer over engine answers (issue 45, class 2): a stand-in OpenAI-compatible server answers
``/v1/completions`` with a valid answer or one drawn malformed or impossible answer (a log-prob
that is null, NaN, inf, positive or of the wrong type; rows that sum past 1 or to less than any
distribution's top-k; top_logprobs as pairs, a list, missing or empty; too few or too many choices;
duplicate, missing or out-of-range ``index``; token ids outside the vocabulary or unreadable; JSON
cut short or of another shape; HTTP errors, a body cut short, a dropped connection).

Each answer is either read exactly as the server meant it (the valid variants: plain-integer
keys, shuffled choices with their index, no index, fewer or more entries than asked, -inf for a
token of probability 0) or refused with one `UserInputError` / `EngineError` line naming what is
wrong; never another exception, and through the CLI never a saved profile.

Bounded: a 12-token vocabulary, 1..3 prompts per request; ``derandomize=True`` and
``PHASEINTERP_FUZZ_EXAMPLES`` (default 12) x 8 drawn answers, after every kind once
(``test_every_kind_of_answer``).
"""

from __future__ import annotations

import http.server
import json
import math
import os
import random
import threading

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from phaseinterp import CompressedConfig, CompressedTransformer
from phaseinterp.engines import OpenAIEngine
from phaseinterp.errors import EngineError, UserInputError
from phaseinterp.tasks import KeyValueRetrieval

EXAMPLES = int(os.environ.get("PHASEINTERP_FUZZ_EXAMPLES", "12"))
FUZZ = settings(max_examples=EXAMPLES * 8, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
V = 12  # the engine's d_vocab in the direct tier
COUNTS: dict[str, int] = {}


# ------------------------------------------------------------- the stand-in server
class DrawnServer:
    """A local /v1/completions server (stdlib ``http.server`` in a thread, as tests/test_engine_profile.py's
    ``StandIn``) whose valid answer is the top-k of ``log_softmax`` of logits seeded by each prompt's ids
    (``meant``: the rows the server means, NaN outside its top-k); ``self.fault(choices, body)`` turns that
    answer into the one it sends: ``(status, bytes)``, or ``("cut", bytes)`` (a Content-Length longer than
    the body) or ``("drop", b"")`` (the connection closed without an answer)."""

    def __init__(self, d_vocab):
        self.d_vocab, self.fault, self.requests = d_vocab, None, 0
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - the stdlib's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests += 1
                status, data = server.answer(body)
                if status == "drop":
                    self.close_connection = True
                    return
                self.send_response(200 if status == "cut" else status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data) + (100 if status == "cut" else 0)))
                self.end_headers()
                self.wfile.write(data)
                self.close_connection = True

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def meant(self, prompt, k):
        """The server's log-probs for one prompt: ``{token id: log-prob}`` of its top ``k``."""
        generator = torch.Generator().manual_seed(hash(tuple(prompt)) % 2**31)
        row = torch.log_softmax(3 * torch.randn(self.d_vocab, generator=generator, dtype=torch.float64), -1)
        top = row.topk(min(k, self.d_vocab))
        return dict(zip(top.indices.tolist(), top.values.tolist()))

    def answer(self, body):
        choices = [{"index": i, "text": "", "finish_reason": "length",
                    "logprobs": {"top_logprobs": [{f"token_id:{t}": v for t, v in self.meant(p, body["logprobs"]).items()}]}}
                   for i, p in enumerate(body["prompt"])]
        body["d_vocab"] = self.d_vocab  # for the faults that name the first id outside the vocabulary
        if self.fault is None:
            return 200, json.dumps({"choices": choices}).encode()
        return self.fault(choices, body)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _json(payload, status=200):
    return status, json.dumps(payload).encode()  # NaN / Infinity as Python writes them (what json.loads reads)


def _top(choice):
    return choice["logprobs"]["top_logprobs"][0]


def _set_value(value):
    """Every drawn prompt's first entry takes ``value``."""
    def fault(choices, body, row):
        top = _top(choices[row])
        top[next(iter(top))] = value
        return _json({"choices": choices})
    return fault


def _all_values(transform):
    def fault(choices, body, row):
        top = _top(choices[row])
        for key in top:
            top[key] = transform(top[key])
        return _json({"choices": choices})
    return fault


def _top_logprobs(value):
    def fault(choices, body, row):
        choices[row]["logprobs"]["top_logprobs"] = value(_top(choices[row]))
        return _json({"choices": choices})
    return fault


def _logprobs_field(value):
    def fault(choices, body, row):
        if value is KeyError:
            del choices[row]["logprobs"]
        else:
            choices[row]["logprobs"] = value
        return _json({"choices": choices})
    return fault


def _choices(edit):
    def fault(choices, body, row):
        return _json({"choices": edit(choices, row)})
    return fault


def _index(value):
    def fault(choices, body, row):
        choices[row]["index"] = value(len(choices), row)
        return _json({"choices": choices})
    return fault


def _key(key):
    def fault(choices, body, row):
        top = _top(choices[row])
        first = next(iter(top))
        top[key(body) if callable(key) else key] = top.pop(first)
        return _json({"choices": choices})
    return fault


def _duplicate_token(choices, body, row):
    top = _top(choices[row])
    first = next(iter(top))
    top[first.split(":")[1]] = top[first] - 1.0  # "token_id:N" and "N": one token, two log-probs
    return _json({"choices": choices})


def _raw(data, status=200):
    def fault(choices, body, row):
        return status, data if isinstance(data, bytes) else data(json.dumps({"choices": choices}).encode())
    return fault


def _cut_json(choices, body, row):
    data = json.dumps({"choices": choices}).encode()
    return 200, data[: max(1, (row + 1) * len(data) // 4)]


# --------------------------------------------------------- valid variants (read as meant)
def _plain_keys(choices, body, row):
    for c in choices:
        c["logprobs"]["top_logprobs"] = [{k.split(":")[1]: v for k, v in _top(c).items()}]
    return _json({"choices": choices})


def _shuffled(choices, body, row):
    random.Random(row).shuffle(choices)
    return _json({"choices": choices})


def _no_index(choices, body, row):
    for c in choices:
        del c["index"]
    return _json({"choices": choices})


def _fewer_entries(choices, body, row):
    top = _top(choices[row])
    for key in list(top)[1 + row:]:
        del top[key]
    return _json({"choices": choices, "usage": {"prompt_tokens": 5}})


def _minus_inf_entry(choices, body, row):
    # a token of probability 0 (outside the meant top-k), as a server with a masked vocabulary reports it
    top = _top(choices[row])
    free = next(t for t in range(V) if f"token_id:{t}" not in top)
    top[f"token_id:{free}"] = -math.inf
    return _json({"choices": choices})


def _minus_inf_meaning(meant, row):
    free = next(t for t in range(V) if t not in meant[row])
    meant[row][free] = -math.inf


def _fewer_meaning(meant, row):
    meant[row] = dict(list(meant[row].items())[: 1 + row])


# name -> (fault, None for a valid answer (with how its meaning changes) or (error class, words it names))
KINDS: dict[str, tuple] = {
    # the instances issue 45 names first
    "null log-prob": (_set_value(None), (UserInputError, r"log-prob None .* not a number")),
    "top_logprobs as [token, logprob] pairs": (_top_logprobs(lambda top: [[k, v] for k, v in top.items()]),
                                               (UserInputError, r"top_logprobs\[0\] as a list, not an object")),
    "every index 0": (_choices(lambda c, row: [{**x, "index": 0} for x in c]), (UserInputError, r"choice index 0 twice")),
    "+50 for every token": (_all_values(lambda v: 50.0), (UserInputError, r"log-prob 50\.0 .* <= 0")),
    # log-prob values
    "NaN log-prob": (_set_value(math.nan), (UserInputError, r"log-prob nan .* not a number")),
    "+inf log-prob": (_set_value(math.inf), (UserInputError, r"log-prob inf .* <= 0")),
    "small positive log-prob": (_set_value(0.5), (UserInputError, r"log-prob 0\.5 .* <= 0")),
    "huge log-prob": (_set_value(1e300), (UserInputError, r"log-prob .* <= 0")),
    "string log-prob": (_set_value("-0.5"), (UserInputError, r"log-prob '-0\.5' .* not a number")),
    "boolean log-prob": (_set_value(False), (UserInputError, r"log-prob False .* not a number")),
    "list log-prob": (_set_value([-0.5]), (UserInputError, r"log-prob \[-0\.5\] .* not a number")),
    "object log-prob": (_set_value({"logprob": -0.5}), (UserInputError, r"not a number")),
    "sums past 1": (_all_values(lambda v: math.log(0.9)), (UserInputError, r"sum to [\d.]+ > 1: not a distribution")),
    "logits, not log-probs": (_all_values(lambda v: v * 0 + 3.0), (UserInputError, r"log-prob 3\.0 .* <= 0")),
    "every log-prob -inf": (_all_values(lambda v: -math.inf), (UserInputError, r"sum to 0, below \d+/12")),
    "shifted far below 0": (_all_values(lambda v: v - 40.0), (UserInputError, r"sum to [\d.e-]+, below \d+/12")),
    # the shape of top_logprobs and logprobs
    "top_logprobs an object": (_top_logprobs(lambda top: top), (UserInputError, r"top_logprobs\[0\] as a dict")),
    "top_logprobs a list of numbers": (_top_logprobs(lambda top: list(top.values())),
                                       (UserInputError, r"top_logprobs\[0\] as a float, not an object")),
    "top_logprobs a string": (_top_logprobs(lambda top: "token_id:1"), (UserInputError, r"top_logprobs\[0\] as a str")),
    "top_logprobs empty list": (_top_logprobs(lambda top: []), (UserInputError, r"no top_logprobs for prompt")),
    "top_logprobs [{}]": (_top_logprobs(lambda top: [{}]), (UserInputError, r"empty choices\[\d\]\.logprobs")),
    "top_logprobs null": (_top_logprobs(lambda top: None), (UserInputError, r"no top_logprobs for prompt")),
    "logprobs missing": (_logprobs_field(KeyError), (UserInputError, r"no top_logprobs for prompt")),
    "logprobs null": (_logprobs_field(None), (UserInputError, r"no top_logprobs for prompt")),
    "logprobs a list": (_logprobs_field([-0.5]), (UserInputError, r"no top_logprobs for prompt")),
    # choices and their index
    "one choice too few": (_choices(lambda c, row: c[:-1]), (UserInputError, r"returned \d choices for \d prompts")),
    "one choice too many": (_choices(lambda c, row: c + [c[row]]), (UserInputError, r"returned \d choices for \d prompts")),
    "no choices": (_choices(lambda c, row: []), (UserInputError, r"returned 0 choices for \d prompts")),
    "choices null": (_choices(lambda c, row: None), (UserInputError, r"'choices' as a NoneType, not a list")),
    "choices an object": (_choices(lambda c, row: {"0": c[0]}), (UserInputError, r"'choices' as a dict, not a list")),
    "a choice a number": (_choices(lambda c, row: c[:row] + [7] + c[row + 1:]), (UserInputError, r"choices\[\d\] as a int")),
    "duplicate index": (_index(lambda n, row: (row + 1) % n if n > 1 else 0),
                        (UserInputError, r"choice index \d twice|returned choice index")),
    "index out of range": (_index(lambda n, row: n), (UserInputError, r"choice index \d for \d prompts")),
    "negative index": (_index(lambda n, row: -1), (UserInputError, r"choice index -1 for")),
    "string index": (_index(lambda n, row: str(row)), (UserInputError, r"choice index '\d' for")),
    "float index": (_index(lambda n, row: row + 0.5), (UserInputError, r"choice index \d\.5 for")),
    "null index": (_index(lambda n, row: None), (UserInputError, r"choice index None for")),
    # token ids
    "token id = d_vocab": (_key(lambda body: f"token_id:{body['d_vocab']}"), (UserInputError, r"token id (\d+), outside 0\.\.\d+")),
    "negative token id": (_key("token_id:-3"), (UserInputError, r"token id -3, outside 0\.\.11")),
    "huge token id": (_key("token_id:" + "9" * 25), (UserInputError, r"token id 9+, outside")),
    "token id not a number": (_key("token_id:abc"), (UserInputError, r"'token_id:abc': 'token_id:' must be followed")),
    "token id a float": (_key("token_id:1.5"), (UserInputError, r"'token_id:1\.5'")),
    "token as text": (_key("hello"), (UserInputError, r"cannot map the returned token 'hello'")),
    "token id 5000 digits": (_key("token_id:" + "1" * 5000), (UserInputError, r"must be followed by an integer")),
    "one token twice": (_duplicate_token, (UserInputError, r"two log-probs for token id \d+")),
    # the answer as a whole
    "answer a list": (_raw(b"[1, 2]"), (UserInputError, r"answered list, not a JSON object")),
    "answer a number": (_raw(b"3"), (UserInputError, r"answered int, not a JSON object")),
    "answer an error object": (_raw(b'{"error": {"message": "model not loaded"}}'),
                               (UserInputError, r"without 'choices' \(\{'message': 'model not loaded'\}\)")),
    "answer cut short": (_cut_json, (UserInputError, r"something other than JSON")),
    "answer HTML": (_raw(b"<html>502 Bad Gateway</html>"), (UserInputError, r"something other than JSON")),
    "answer empty": (_raw(b""), (UserInputError, r"something other than JSON")),
    "answer not UTF-8": (_raw(b'{"choices": "\xff\xfe"}'), (UserInputError, r"something other than JSON")),
    "HTTP 400": (_raw(b'{"error": "bad request"}', 400), (UserInputError, r"answered HTTP 400.*check the URL")),
    "HTTP 401": (_raw(b"unauthorized", 401), (UserInputError, r"answered HTTP 401")),
    "HTTP 404": (_raw(b"not found", 404), (UserInputError, r"answered HTTP 404")),
    "HTTP 429": (_raw(b"slow down", 429), (EngineError, r"answered HTTP 429")),
    "HTTP 500": (_raw(b"internal error", 500), (EngineError, r"answered HTTP 500")),
    "HTTP 503": (_raw(b"restarting", 503), (EngineError, r"answered HTTP 503")),
    "body cut short": (lambda c, b, row: ("cut", json.dumps({"choices": c}).encode()),
                       (EngineError, r"broken HTTP answer \(IncompleteRead|cannot reach")),
    "connection dropped": (lambda c, b, row: ("drop", b""), (EngineError, r"cannot reach .*")),
    # valid answers: read exactly as meant
    "as sent": (lambda c, b, row: _json({"choices": c}), None),
    "plain integer keys": (_plain_keys, None),
    "shuffled choices": (_shuffled, None),
    "no index": (_no_index, None),
    "fewer entries than asked": (_fewer_entries, _fewer_meaning),
    "-inf for a token of probability 0": (_minus_inf_entry, _minus_inf_meaning),
}
VALID = [name for name, (_, expect) in KINDS.items() if expect is None or callable(expect)]


@pytest.fixture(scope="module")
def server():
    s = DrawnServer(V)
    yield s
    s.close()


def _check(server, name, tokens, k, row):
    """Ask for ``tokens`` with answer kind ``name`` at prompt ``row``; the outcome must be the meant rows
    or one line naming what is wrong."""
    fault, expect = KINDS[name]
    server.fault = None if fault is None else (lambda choices, body: fault(choices, body, row))
    engine = OpenAIEngine(server.url, "stand-in", d_vocab=V, top_logprobs=k, timeout=10)
    COUNTS[name] = COUNTS.get(name, 0) + 1
    if expect is None or callable(expect):
        out = engine(tokens)
        meant = [server.meant(p, k) for p in tokens.tolist()]
        if callable(expect):
            expect(meant, row)
        wanted = torch.full((len(tokens), V), math.nan)
        for i, entries in enumerate(meant):
            for t, v in entries.items():
                wanted[i, t] = v
        torch.testing.assert_close(out, wanted, equal_nan=True, rtol=0, atol=0)
        return
    kind, words = expect
    with pytest.raises((UserInputError, EngineError)) as caught:
        engine(tokens)
    assert type(caught.value) is kind, (name, type(caught.value), caught.value)
    text = str(caught.value)
    assert "\n" not in text and len(text) < 700, (name, text)
    assert __import__("re").search(words, text), (name, text)


@pytest.mark.parametrize("name", list(KINDS))
def test_every_kind_of_answer(name, server):
    """Each kind once: 2 prompts, top-5, the fault at prompt 1 (the issue's instances first)."""
    tokens = torch.tensor([[1, 2, 3, 4, 5], [5, 4, 3, 2, 1]])
    _check(server, name, tokens, 5, 1)


@FUZZ
@given(name=st.sampled_from(list(KINDS)), n=st.integers(1, 3), k=st.integers(3, V + 2), length=st.integers(1, 6),
       seed=st.integers(0, 2**16), data=st.data())
def test_drawn_answers_are_read_as_meant_or_refused_in_one_line(name, n, k, length, seed, data, server):
    tokens = torch.randint(0, V, (n, length), generator=torch.Generator().manual_seed(seed))
    row = data.draw(st.integers(0, n - 1), label="faulty prompt")
    if name in ("duplicate index", "every index 0") and n == 1:
        name = "one choice too many"  # a single prompt has no other index to repeat, none to lose but the one
    if name == "-inf for a token of probability 0" and k >= V:
        name = "as sent"  # every token is in the top-k: none is left to report at -inf
    _check(server, name, tokens, k, row)


# ------------------------------------------------------------------ through the CLI: nothing saved
TASK = KeyValueRetrieval(seq_len=64, n_records=8, n_demos=2, min_distance=20, residue_modulus=8)
CFG = CompressedConfig(d_vocab=TASK.vocab.size, n_ctx=64, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1,
                       d_head=16, d_mlp=64, window=4, stride=4, local_window=8)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz_answers") / "model"
    model = CompressedTransformer(CFG)
    model.metadata.update(task=TASK.to_dict(), task_type="KeyValueRetrieval")
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def task_server():
    s = DrawnServer(TASK.vocab.size)
    yield s
    s.close()


def _cli(url, checkpoint, out, journal):
    from phaseinterp.cli import main

    return main(["profile", str(checkpoint), "--engine", url, "--model-name", "stand-in", "--top-logprobs", "5",
                 "--n-per-residue", "23", "--retries", "0", "--shard-dir", str(journal), "--out", str(out)])


def test_cli_saves_the_profile_of_a_valid_answer(task_server, checkpoint, tmp_path, capsys):
    task_server.fault = None
    assert _cli(task_server.url, checkpoint, tmp_path / "p", tmp_path / "j") == 0
    from phaseinterp.profile import PhaseProfile

    assert int(PhaseProfile.load(tmp_path / "p").residue_n.sum()) == 23 * 8


@settings(max_examples=EXAMPLES * 2, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(name=st.sampled_from([n for n in KINDS if n not in VALID]), first_good=st.integers(0, 2))
def test_cli_refuses_a_drawn_answer_in_one_line_and_saves_nothing(name, first_good, task_server, checkpoint, tmp_path,
                                                                  capsys):
    """The fault comes after ``first_good`` valid requests: the refusal names it, and no profile is saved."""
    import shutil

    fault, _ = KINDS[name]
    start = task_server.requests

    def drawn(choices, body):
        if task_server.requests - start <= first_good:
            return _json({"choices": choices})
        return fault(choices, body, 0)

    task_server.fault = drawn
    out, journal = tmp_path / "out", tmp_path / "journal"
    COUNTS[f"cli: {name}"] = COUNTS.get(f"cli: {name}", 0) + 1
    try:
        code = _cli(task_server.url, checkpoint, out, journal)
        err = capsys.readouterr().err.strip()
        assert code == 2, (name, code, err)
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("phaseinterp: error:"), (name, err)
        assert not out.exists(), f"{name}: a profile was saved"
    finally:
        shutil.rmtree(journal, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)


@pytest.fixture(scope="module", autouse=True)
def report_counts(request):
    """Prints how many answers of each kind this process drew after the file's tests, captured or not (run the whole
    file to see them all). A fixture's teardown, not a test: it checks nothing."""
    yield
    with request.config.pluginmanager.getplugin("capturemanager").global_and_fixture_disabled():
        print(f"\nengine answers drawn: {sum(v for k, v in COUNTS.items() if not k.startswith('cli'))} over "
              f"{len({k for k in COUNTS if not k.startswith('cli')})} kinds; through the CLI: "
              f"{sum(v for k, v in COUNTS.items() if k.startswith('cli'))}", dict(sorted(COUNTS.items())))
