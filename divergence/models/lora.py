"""LoRA adapters (peft) on the denoiser's attention projections, tracked as effective changes.

``apply_lora`` injects peft LoRA layers into the modules ``model.lora.targets`` names and leaves
only the adapters (and any new projection layers of a transformer denoiser) trainable; the
adapters' random ``A`` factors are drawn from ``model.seed`` alone, ``B`` starts at zero (peft's
default), so step 0 is the base model exactly.

``tracked_weights`` is what the store, the checkpoints and the in-training comparison see: for
every LoRA layer its effective change ``delta_W = (alpha / r) B A`` named ``<module>.lora_delta``
(``divergence.checkpoints.lora``), and every other trainable weight by its own name; the frozen
base weights, equal in both arms, are left out. Without LoRA it is the plain ``state_dict``.
"""

from __future__ import annotations

import torch

from divergence.checkpoints.lora import SUFFIX, factor_pairs, lora_delta
from divergence.errors import RecipeError
from divergence.models.build import seeded
from divergence.recipe.model import LoraConfig

ADAPTER = "default"


def apply_lora(denoiser: torch.nn.Module, config: LoraConfig | None, seed: int = 0) -> None:
    """Inject LoRA layers (rank ``config.rank``, ``alpha``) into ``config.targets``; freeze the rest."""
    if config is None:
        return
    try:
        from peft import LoraConfig as PeftLoraConfig, inject_adapter_in_model
    except ImportError:
        raise RecipeError("model.lora needs the peft package: pip install 'divergence[lora]'") from None
    inner = getattr(denoiser, "transformer", denoiser)
    peft_config = PeftLoraConfig(r=config.rank, lora_alpha=config.alpha, target_modules=list(config.targets))
    with seeded(seed, "lora"):
        try:
            inject_adapter_in_model(peft_config, inner, adapter_name=ADAPTER)
        except ValueError as err:
            raise RecipeError(f"model.lora.targets {list(config.targets)}: {str(err).splitlines()[0]}") from None
    for name, param in denoiser.named_parameters():
        # adapters train; so do layers outside the pretrained model (TransformerDenoiser projections)
        param.requires_grad_(".lora_" in name or (inner is not denoiser and not name.startswith("transformer.")))


def tracked_weights(denoiser: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The denoiser's weights as tracked: ``state_dict`` without LoRA; with LoRA, each layer's
    ``<module>.lora_delta`` plus the other trainable weights (see the module docstring)."""
    state = denoiser.state_dict()
    pairs = factor_pairs(state)
    if not pairs:
        return state
    scales = {  # {module: alpha / r} of each LoRA layer, as peft applies it (``layer.scaling``)
        name: float(module.scaling[ADAPTER])
        for name, module in denoiser.named_modules()
        if isinstance(getattr(module, "scaling", None), dict) and ADAPTER in module.scaling
    }
    out = {}
    with torch.no_grad():
        for module, (name_a, name_b) in pairs.items():
            out[f"{module}.{SUFFIX}"] = lora_delta(state[name_a], state[name_b], scales[module])
    trainable = {n for n, p in denoiser.named_parameters() if p.requires_grad and ".lora_" not in n}
    out.update({n: state[n] for n in state if n in trainable})
    return out
