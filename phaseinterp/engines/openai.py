"""`OpenAIEngine`: next-token log-probs from an OpenAI-compatible completions server.

The request (stdlib ``urllib``, one POST per batch, no other dependency)::

    POST {base_url}/v1/completions
    {"model": MODEL, "prompt": [[ids...], ...], "max_tokens": 1, "temperature": 0,
     "logprobs": TOP_K, "return_tokens_as_token_ids": true}

Token ids go in as ``prompt`` (a list of id lists: no tokenizer round trip, so the server sees
exactly the phase-controlled sequence). ``choices[i].logprobs.top_logprobs[0]`` is the top-k
of the first generated token; its keys are read as ``"token_id:N"`` (vLLM's
``return_tokens_as_token_ids``), plain integers, or through ``token_to_id`` (e.g. a
tokenizer's ``convert_tokens_to_ids``) for servers that return token strings. Entries outside
the top-k stay ``NaN``: the conformance check then compares the reported ones only.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any, Callable, Optional

import torch
from jaxtyping import Float, Int
from torch import Tensor


class OpenAIEngine:
    """An `Engine` over an OpenAI-compatible server's ``/v1/completions`` logprobs (see module doc).

    ``d_vocab``: the model's vocabulary size (the width of the returned rows); ``top_logprobs``:
    how many log-probs to ask for (servers cap it; vLLM's default cap is 20); ``headers``: extra
    HTTP headers (e.g. ``{"Authorization": "Bearer ..."}``); ``timeout`` in seconds.
    """

    def __init__(self, base_url: str, model: str, d_vocab: int, *, top_logprobs: int = 20,
                 token_to_id: Optional[Callable[[str], int]] = None, headers: Optional[dict] = None,
                 timeout: float = 60.0, name: Optional[str] = None):
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url={base_url!r} must start with http:// or https://")
        if isinstance(d_vocab, bool) or not isinstance(d_vocab, int) or d_vocab < 1:
            raise ValueError(f"d_vocab={d_vocab!r} must be an integer >= 1")
        if isinstance(top_logprobs, bool) or not isinstance(top_logprobs, int) or top_logprobs < 1:
            raise ValueError(f"top_logprobs={top_logprobs!r} must be an integer >= 1")
        base = base_url.rstrip("/")
        self.url = base + ("/completions" if base.endswith("/v1") else "/v1/completions")
        self.model, self.d_vocab, self.top_logprobs = model, d_vocab, top_logprobs
        self.token_to_id, self.headers, self.timeout = token_to_id, dict(headers or {}), timeout
        self.name = name or f"openai:{model}"

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(self.url, data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json", **self.headers})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as err:
            raise RuntimeError(f"{self.url} answered HTTP {err.code}: {err.read()[:300]!r}") from None

    def _token_id(self, key: str) -> int:
        if key.startswith("token_id:"):
            return int(key.split(":", 1)[1])
        if self.token_to_id is not None:
            return int(self.token_to_id(key))
        try:
            return int(key)
        except ValueError:
            raise ValueError(f"cannot map the returned token {key!r} to an id: ask the server for "
                             "return_tokens_as_token_ids or pass token_to_id=") from None

    def __call__(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch d_vocab"]:
        body = {"model": self.model, "prompt": tokens.tolist(), "max_tokens": 1, "temperature": 0,
                "logprobs": self.top_logprobs, "return_tokens_as_token_ids": True}
        choices = self._post(body).get("choices")
        if not isinstance(choices, list) or len(choices) != tokens.shape[0]:
            got = len(choices) if isinstance(choices, list) else choices
            raise RuntimeError(f"{self.url} returned {got} choices for {tokens.shape[0]} prompts")
        out = torch.full((tokens.shape[0], self.d_vocab), float("nan"))
        for position, choice in enumerate(choices):
            row = choice.get("index", position)
            top = (choice.get("logprobs") or {}).get("top_logprobs") or []
            if not top:
                raise RuntimeError(f"{self.url} returned no top_logprobs for prompt {row}")
            for key, value in top[0].items():
                token = self._token_id(key)
                if not 0 <= token < self.d_vocab:
                    raise ValueError(f"the server returned token id {token}, outside 0..{self.d_vocab - 1}")
                out[row, token] = float(value)
        return out


__all__ = ["OpenAIEngine"]
