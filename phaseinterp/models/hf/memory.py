"""How much memory a DeepSeek-V4 checkpoint needs, counted from its config (no weights read).

The model is instantiated on PyTorch's ``meta`` device (shapes only), so the count is exact
for the architecture transformers builds from that config. Weight bytes = parameters x bytes
per parameter; the routed experts can be counted at a different width (the released
checkpoints ship FP8 experts). ``python -m phaseinterp.models.hf.memory [config.json|DIR]``
prints the table (no argument: transformers' default ``DeepseekV4Config``, the V4-Flash shape).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union


@dataclass(frozen=True)
class MemoryEstimate:
    """Parameter counts and weight memory of one config (activations and KV cache not included)."""

    n_params: int
    n_expert_params: int  # routed experts (gate_up_proj, down_proj)
    n_layers: int

    @property
    def n_other_params(self) -> int:
        return self.n_params - self.n_expert_params

    def weight_gib(self, bytes_per_param: float = 2.0, expert_bytes_per_param: float | None = None) -> float:
        """Weights in GiB: ``bytes_per_param`` for everything, experts at ``expert_bytes_per_param`` if given."""
        experts = self.n_expert_params * (bytes_per_param if expert_bytes_per_param is None else expert_bytes_per_param)
        return (self.n_other_params * bytes_per_param + experts) / 2**30

    def summary(self) -> dict[str, Any]:
        return {"n_params": self.n_params, "n_expert_params": self.n_expert_params, "n_layers": self.n_layers,
                "bf16_gib": round(self.weight_gib(2.0), 1), "fp8_experts_bf16_rest_gib": round(self.weight_gib(2.0, 1.0), 1),
                "fp32_gib": round(self.weight_gib(4.0), 1)}


def config_from_dict(raw: dict) -> Any:
    """A ``DeepseekV4Config`` from a ``config.json``'s fields: the architecture only (the
    ``quantization_config`` is a quantizer's packing, not a shape; legacy release fields such as
    ``compress_rate_csa`` or ``num_hash_layers`` fold in as transformers does)."""
    from transformers import DeepseekV4Config

    fields = {k: v for k, v in raw.items() if k not in ("architectures", "model_type", "transformers_version",
                                                         "quantization_config", "expert_dtype")}
    return DeepseekV4Config(**fields)


def estimate_memory(config: Union[str, Path, Any, None] = None) -> MemoryEstimate:
    """Count the parameters of a ``DeepseekV4Config``, a ``config.json`` path or a checkpoint directory."""
    import torch
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

    if config is None:
        config = DeepseekV4Config()
    elif isinstance(config, (str, Path)):
        path = Path(config)
        path = path / "config.json" if path.is_dir() else path
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist (pass a config.json or a checkpoint directory)")
        config = config_from_dict(json.loads(path.read_text()))
    with torch.device("meta"):
        model = DeepseekV4ForCausalLM(config)
    total = sum(p.numel() for p in model.parameters())
    experts = sum(p.numel() for n, p in model.named_parameters() if ".mlp.experts." in n)
    return MemoryEstimate(n_params=int(total), n_expert_params=int(experts), n_layers=int(config.num_hidden_layers))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    est = estimate_memory(argv[0] if argv else None)
    for key, value in est.summary().items():
        print(f"{key}: {value:,}" if isinstance(value, int) else f"{key}: {value}")


if __name__ == "__main__":
    main()
