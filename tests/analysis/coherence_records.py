"""Synthetic coherence records: the step-record keys of a pair whose update error has a known bias."""

import numpy as np
import torch

from divergence.metrics.coherence import LayeredCoherence


def coherence_extra(share: float, every: int = 3, dim: int = 4096, status: str | None = None):
    """``extra(category, replicate, step)`` for ``write_dose_study``: the optimization pair's records of
    ``e_t = sqrt(share) b + sqrt(1 - share) n_t`` (unit ``b`` fixed per replicate, ``n_t`` iid unit
    directions) in two layers, every ``every`` steps, as the training callback writes them;
    ``status`` instead writes only ``coherence_status`` (a pair that is not measurable)."""
    sums: dict[int, LayeredCoherence] = {}

    def extra(category, replicate, step):
        if category != "optimization" or step < 1 or step % every:
            return {}
        if status is not None:
            return {"coherence_status": status}
        rng = np.random.default_rng([replicate, step])
        bias = np.random.default_rng(replicate).standard_normal(dim)
        noise = rng.standard_normal(dim)
        e = np.sqrt(share) * bias / np.linalg.norm(bias) + np.sqrt(1 - share) * noise / np.linalg.norm(noise)
        out = sums.setdefault(replicate, LayeredCoherence()).add(
            {"unet.down_blocks.0": torch.tensor(e[: dim // 2]), "unet.up_blocks.0": torch.tensor(e[dim // 2 :])}
        )
        m = out["model"]
        return {
            "coherence": m["coherence"],
            "coherence_steps": m["steps"],
            "coherence_cos": m["cos"],
            "coherence_mean_cos": m["mean_cos"],
            "coherence_err": m["err_norm"],
            "coherence_grad": 1e3 * m["err_norm"],
            "coherence_layers": out["layers"],
        }

    return extra
