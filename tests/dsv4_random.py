"""A random Hugging Face DeepSeek-V4 for the tests: gates, sinks and hash routes off their zero init."""

from __future__ import annotations

import torch
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM


def randomized(config: DeepseekV4Config, seed: int = 0) -> DeepseekV4ForCausalLM:
    """``DeepseekV4ForCausalLM(config)`` (eval) with its position biases and sinks drawn from N(0, 1)
    and its hash routes drawn uniformly: at their zero init every slot and expert would look alike."""
    torch.manual_seed(seed)
    model = DeepseekV4ForCausalLM(config).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("position_bias", "sinks")):
                p.copy_(torch.randn(p.shape, generator=gen))
        for name, buf in model.named_buffers():
            if name.endswith("tid2eid"):
                buf.copy_(torch.randint(0, config.n_routed_experts, buf.shape, generator=gen))
    return model
