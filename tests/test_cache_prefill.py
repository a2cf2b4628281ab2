"""``return_type="cache"``: a prefill that only fills the cache. Both families: the cache it leaves
is the one a full prefill leaves (the steps after it give the same bits), the last layer stops once
its cache is written (its later hooks do not fire, every earlier one does), and bad combinations
are refused before any work."""

from __future__ import annotations

import pytest
import torch

from phaseinterp.errors import UserInputError

FAMILIES = [pytest.param("w4s4", "hook_k", marks=pytest.mark.zoo("w4s4")),
            pytest.param("dsv4-tiny", "hook_kv", marks=pytest.mark.zoo("dsv4-tiny"))]


def _tokens(model, n: int = 3, length: int = 37) -> torch.Tensor:
    return torch.randint(0, model.cfg.d_vocab, (n, length), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize(("name", "kv_hook"), FAMILIES)
def test_the_cache_it_leaves_is_a_full_prefill_s(zoo_model, name, kv_hook):
    model = zoo_model(name)
    tokens = _tokens(model)
    p = 29
    with torch.no_grad():
        full, only = model.init_cache(), model.init_cache()
        model(tokens[:, :p], cache=full, return_type=None)
        assert model(tokens[:, :p], cache=only, return_type="cache") is None
        assert only.length == full.length == p
        for t in range(p, tokens.shape[1]):  # steps after either prefill: the same bits
            a = model(tokens[:, t : t + 1], cache=full)
            b = model(tokens[:, t : t + 1], cache=only)
            assert torch.equal(a, b), t
        whole = model(tokens)[:, -1]
        last = model.last_logits(tokens)
    assert torch.allclose(last, whole, rtol=1e-4, atol=1e-4 * whole.abs().max().item())


@pytest.mark.parametrize(("name", "kv_hook"), FAMILIES)
def test_the_last_layer_stops_once_its_cache_is_written(zoo_model, name, kv_hook):
    model = zoo_model(name)
    last = model.cfg.n_layers - 1
    seen: dict[str, tuple] = {}
    names = lambda hook_name: hook_name.startswith("blocks.")  # noqa: E731
    with torch.no_grad(), model.hooks(fwd_hooks=[(names, lambda x, hook: seen.__setitem__(hook.name, x.shape))]):
        model(_tokens(model), cache=model.init_cache(), return_type="cache")
    fired = set(seen)
    assert f"blocks.{last}.attn.{kv_hook}" in fired and f"blocks.{last}.hook_resid_pre" in fired
    for later in ("attn.hook_z", "hook_attn_out", "hook_mlp_out", "hook_resid_post"):
        assert f"blocks.{last}.{later}" not in fired
        assert f"blocks.{last - 1}.{later}" in fired  # the layers below run in full


@pytest.mark.zoo("w4s4")
def test_bad_combinations_are_refused_before_any_work(zoo_model):
    model = zoo_model("w4s4")
    tokens = _tokens(model)
    with pytest.raises(UserInputError, match=r"return_type='cache' extends a cache .*cache=model.init_cache\(\)"):
        model(tokens, return_type="cache")
    cache = model.init_cache()
    model(tokens[:, :5], cache=cache, return_type="cache")
    with pytest.raises(UserInputError, match="a fork is never extended"):
        model(tokens[:, 5:6], cache=cache.fork(), return_type="cache")
    with pytest.raises(UserInputError, match="stop_at_layer returns the residual"):
        model(tokens[:, 5:], cache=cache, return_type="cache", stop_at_layer=1)
    with pytest.raises(UserInputError, match=r"return_type='cached' is not one of \('logits', 'loss', None, 'cache'\)"):
        model(tokens, return_type="cached")
    assert cache.length == 5  # nothing ran
