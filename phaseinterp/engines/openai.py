"""`OpenAIEngine`: next-token log-probs from an OpenAI-compatible completions server (stdlib ``urllib``)::

    POST {base_url}/v1/completions
    {"model": MODEL, "prompt": [[ids...], ...], "max_tokens": 1, "temperature": 0,
     "logprobs": TOP_K, "return_tokens_as_token_ids": true}

Token ids go in as ``prompt``, so the server sees exactly the phase-controlled sequence. The keys of
``choices[i].logprobs.top_logprobs[0]`` are read as ``"token_id:N"``, plain integers, or through
``token_to_id``; entries outside the top-k stay ``NaN``. `OpenAIEngine.warm` sends the donors, then the
prompts, leaving reuse to the server's prefix cache.

Errors: unreachable, timed out or HTTP 408/429/5xx raise `EngineError` (retried by `phase_profile`);
a schema refusing token-id prompts, a bad URL, other HTTP 4xx, too few choices, no log-probs or ids
outside ``0..d_vocab-1`` raise `UserInputError` naming the problem."""

from __future__ import annotations

import http.client
import json
import math
import re
import socket
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Optional

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from phaseinterp._checks import check_int, check_name, check_real
from phaseinterp.engines.adapters import check_warm_rows
from phaseinterp.engines.answers import NORMALIZATION_SLACK, check_logprob_rows
from phaseinterp.errors import EngineError, UserInputError

RETRYABLE_HTTP = (408, 429, 500, 502, 503, 504)  # the server is busy or restarting: worth another try
# A server whose request schema takes text prompts only answers a token-id prompt with a validation error,
# some (llama-cpp-python 0.3.36's server: HTTP 500, "'loc': ('body', 'prompt', 'str'), 'msg': 'Input should
# be a valid string'") with a 5xx. The same request can never succeed, so it is a refusal, not a retry.
_TEXT_ONLY_PROMPT = re.compile(r"prompt.{0,120}(valid string|string_type|must be a string|expected str)",
                               re.IGNORECASE | re.DOTALL)


def _short(text: str, limit: int = 60) -> str:
    """``repr(text)``, cut to ``limit`` characters: a message names a returned token, never pastes a page."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"... ({len(text)} characters)"


def refuses_token_ids(body: str) -> bool:
    """Whether an error ``body`` says the server's ``prompt`` field takes text only (no token ids)."""
    return bool(_TEXT_ONLY_PROMPT.search(body))


class OpenAIEngine:
    """An `Engine` over an OpenAI-compatible server's ``/v1/completions`` logprobs (module docstring).

    ``d_vocab``: the width of the returned rows; ``top_logprobs``: how many log-probs to ask for
    (servers cap it); ``headers``: extra HTTP headers; ``timeout`` in seconds."""

    def __init__(self, base_url: str, model: str, d_vocab: int, *, top_logprobs: int = 20,
                 token_to_id: Optional[Callable[[str], int]] = None, headers: Optional[dict] = None,
                 timeout: float = 60.0, name: Optional[str] = None):
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise UserInputError(f"base_url={base_url!r} must start with http:// or https://")
        try:
            parts = urllib.parse.urlsplit(base_url)
            parts.port  # noqa: B018 - raises on a port that is not a number in 0..65535
        except ValueError as err:
            raise UserInputError(f"base_url={base_url!r} is not a valid URL ({err})") from None
        if not parts.hostname or parts.query or parts.fragment:
            raise UserInputError(f"base_url={base_url!r} must be http(s)://HOST[:PORT][/PATH] with a host and no "
                                 "query or fragment, e.g. http://localhost:8000")
        if not isinstance(model, str) or not model.strip():
            raise UserInputError(f"model={model!r} must be the served model's name (a non-empty str: its /v1/models id)")
        d_vocab = check_int("d_vocab", d_vocab, 1)
        top_logprobs = check_int("top_logprobs", top_logprobs, 1)
        timeout = check_real("timeout", timeout, 0.0, low_open=True, why=" (seconds per request)")
        base = base_url.rstrip("/")
        self.url = base + ("/completions" if base.endswith("/v1") else "/v1/completions")
        self.models_url = base + ("/models" if base.endswith("/v1") else "/v1/models")
        self.model, self.d_vocab, self.top_logprobs = model, d_vocab, top_logprobs
        self.token_to_id, self.headers, self.timeout = token_to_id, dict(headers or {}), timeout
        self.name = name or f"openai:{model}"

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(self.url, data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json", **self.headers})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                text = response.read()
        except urllib.error.HTTPError as err:
            body_text = err.read().decode("utf-8", "replace")
            detail = f"{self.url} answered HTTP {err.code}: {body_text[:300]!r}"
            if refuses_token_ids(body_text):
                raise UserInputError(
                    f"{self.url} does not take token-id prompts (its request schema wants text), so it cannot "
                    "be sent the phase-controlled sequence; serve the model with a server that accepts "
                    "'prompt' as lists of token ids and returns top logprobs (vLLM, SGLang; see docs/engines.md, "
                    "'Phase profiles of a served model'), or run a GGUF in process with phaseinterp.engines.LlamaCppEngine. "
                    f"Server said: {detail}") from None
            if err.code in RETRYABLE_HTTP:
                raise EngineError(detail) from None
            try:  # a name the server does not serve is named with those it does
                self.check_model_name()
            except UserInputError as refused:
                raise UserInputError(f"{refused} ({self.url} answered HTTP {err.code})") from None
            raise UserInputError(f"{detail} (check the URL and the model name {self.model!r})") from None
        except (urllib.error.URLError, OSError) as err:  # refused, unknown host, reset, timed out
            reason = getattr(err, "reason", err)
            if isinstance(reason, socket.timeout) or isinstance(err, TimeoutError):
                reason = f"no answer within timeout={self.timeout} s"
            raise EngineError(f"cannot reach {self.url}: {reason}") from None
        except http.client.HTTPException as err:  # an answer cut short (IncompleteRead), a garbled status line
            raise EngineError(f"{self.url} sent a broken HTTP answer ({type(err).__name__}: {str(err)[:200]})") from None
        try:
            answer = json.loads(text)
        except ValueError:
            raise UserInputError(f"{self.url} answered with something other than JSON: {text[:200]!r}") from None
        if not isinstance(answer, dict):
            raise UserInputError(f"{self.url} answered {type(answer).__name__}, not a JSON object with 'choices'")
        return answer

    def served_models(self, timeout: float = 10.0) -> Optional[list[str]]:
        """The model names the server serves (the ids of OpenAI's ``GET /v1/models`` list), or None when it
        does not say (no such endpoint, not reachable, not the list's format): then nothing is checked."""
        timeout = check_real("timeout", timeout, 0.0, low_open=True, why=" (seconds)")
        request = urllib.request.Request(self.models_url, method="GET", headers=dict(self.headers))
        try:
            with urllib.request.urlopen(request, timeout=min(timeout, self.timeout)) as response:
                answer = json.loads(response.read())
        except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError):
            return None
        data = answer.get("data") if isinstance(answer, dict) else None
        if not isinstance(data, list):
            return None
        ids = [entry["id"] for entry in data if isinstance(entry, dict) and isinstance(entry.get("id"), str)]
        return ids or None

    def check_model_name(self, name: str = "model") -> None:
        """Refuse a model name the server does not serve, naming the ones it does and the nearest
        (`phaseinterp._checks.check_name`); a server that lists no models is not refused. ``name``: the
        argument named. A completions request failing with HTTP 4xx calls it too."""
        served = self.served_models()
        if served is not None:
            check_name(name, self.model, served, what=f"a model {self.models_url} serves",
                       where=f"GET {self.models_url} lists them")

    def _token_id(self, key: str) -> int:
        if key.startswith("token_id:"):
            number = key.split(":", 1)[1]
            if not re.fullmatch(r"-?[0-9]{1,30}", number.strip()):
                raise UserInputError(f"{self.url} returned the token {_short(key)}: 'token_id:' must be followed by an "
                                     "integer id")
            return int(number)
        if self.token_to_id is not None:
            token = self.token_to_id(key)
            if isinstance(token, bool) or not isinstance(token, (int, np.integer)):
                raise UserInputError(f"token_to_id maps the returned token {_short(key)} to {token!r}, not a token id: "
                                     "the tokenizer is not the served model's")
            return int(token)
        if re.fullmatch(r"-?[0-9]{1,30}", key.strip()):
            return int(key)
        raise UserInputError(f"cannot map the returned token {_short(key)} to an id: ask the server for "
                             "return_tokens_as_token_ids or pass token_to_id=")

    def warm(self, donors: Int[Tensor, "batch pos"], tokens: Int[Tensor, "batch pos"],
             prefix_len: int) -> Float[Tensor, "batch d_vocab"]:
        """Log-probs after each row of ``tokens``, asked right after one request with the ``donors``
        (`WarmEngine`); whether and how much of the shared ``prefix_len`` tokens the server reuses is
        the server's choice (its prefix cache), not sent."""
        check_warm_rows(donors, tokens, prefix_len)
        self(donors)  # answers discarded: the request only fills the server's prefix cache
        return self(tokens)

    def __call__(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch d_vocab"]:
        body = {"model": self.model, "prompt": tokens.tolist(), "max_tokens": 1, "temperature": 0,
                "logprobs": self.top_logprobs, "return_tokens_as_token_ids": True}
        answer = self._post(body)
        if "choices" not in answer:
            said = answer.get("error", sorted(answer)[:5])
            raise UserInputError(f"{self.url} answered without 'choices' ({str(said)[:200]}): not a completions "
                                 "answer")
        choices = answer["choices"]
        if not isinstance(choices, list):
            raise UserInputError(f"{self.url} returned 'choices' as a {type(choices).__name__}, not a list of one "
                                 f"choice per prompt ({tokens.shape[0]} prompts)")
        if len(choices) != tokens.shape[0]:
            got = len(choices)
            raise UserInputError(f"{self.url} returned {got} choices for {tokens.shape[0]} prompts (a server that "
                                 "takes one prompt per request needs batch_size=1)")
        out = torch.full((tokens.shape[0], self.d_vocab), float("nan"))
        seen: dict[int, int] = {}
        for position, choice in enumerate(choices):
            if not isinstance(choice, dict):
                raise UserInputError(f"{self.url} returned choices[{position}] as a {type(choice).__name__}, not an "
                                     "object with 'index' and 'logprobs'")
            row = choice.get("index", position)
            if isinstance(row, bool) or not isinstance(row, int) or not 0 <= row < tokens.shape[0]:
                raise UserInputError(f"{self.url} returned choice index {row!r} for {tokens.shape[0]} prompts "
                                     f"(valid: 0..{tokens.shape[0] - 1})")
            if row in seen:
                raise UserInputError(f"{self.url} returned choice index {row} twice (choices[{seen[row]}] and "
                                     f"choices[{position}]) for {tokens.shape[0]} prompts: each prompt needs its own "
                                     "choice")
            seen[row] = position
            logprobs = choice.get("logprobs")
            top = logprobs.get("top_logprobs") if isinstance(logprobs, dict) else None
            if not top:
                raise UserInputError(f"{self.url} returned no top_logprobs for prompt {row}: the server must answer "
                                     f"'logprobs': {self.top_logprobs} with choices[i].logprobs.top_logprobs (vLLM: "
                                     "start it with --max-logprobs >= that)")
            if not isinstance(top, list) or not isinstance(top[0], dict):
                shape = type(top[0]).__name__ if isinstance(top, list) else type(top).__name__
                raise UserInputError(f"{self.url} returned choices[{position}].logprobs.top_logprobs[0] as a {shape}, "
                                     "not an object {token: log-prob} (the completions API's format)")
            if not top[0]:
                raise UserInputError(f"{self.url} returned an empty choices[{position}].logprobs.top_logprobs[0] for "
                                     f"prompt {row}: no token's log-prob")
            keys: dict[int, str] = {}
            for key, value in top[0].items():
                token = self._token_id(key)
                if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < self.d_vocab:
                    raise UserInputError(f"{self.url} returned token id {token!r}, outside 0..{self.d_vocab - 1} "
                                         f"(d_vocab={self.d_vocab}): the served model's vocabulary is not the task's")
                if token in keys:
                    raise UserInputError(f"{self.url} returned two log-probs for token id {token} of prompt {row} "
                                         f"({_short(keys[token])} and {_short(key)})")
                keys[token] = key
                if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
                    raise UserInputError(f"{self.url} returned log-prob {repr(value)[:60]} for token {_short(key)} of "
                                         f"prompt {row}: not a number")
                if value > NORMALIZATION_SLACK:  # checked before float32 holds it (1e300 would overflow)
                    raise UserInputError(f"{self.url} returned log-prob {float(value)} for token {token} of prompt "
                                         f"{row}: a log-probability is <= 0 (finite, or -inf for probability 0)")
                out[row, token] = float(value) if value > -3e38 else -math.inf  # below float32: probability 0
        check_logprob_rows(out, self.url)
        return out


__all__ = ["OpenAIEngine"]
