"""Key families of a checkpoint: the raw weights, and their EMA under ``ema.``.

The built-in trainer's weights files hold the raw weights (``unet.<name>``,
``text_encoder.<name>``) and, with ``train.ema``, their exponential moving average under the
same names prefixed ``ema.`` (``ema.unet.<name>``). Every tensor is compared; the whole-model
summaries are per family, so an EMA never mixes into the raw weights' numbers (a control pair's
or a seed pair's raw summary is the same with or without ``train.ema``).

>>> family_of("ema.unet.conv_in.weight"), family_of("unet.conv_in.weight")
('ema', 'weights')
"""

from __future__ import annotations

EMA_PREFIX = "ema."
FAMILIES = ("weights", "ema")


def family_of(name: str) -> str:
    """``ema`` for a tensor named ``ema.<...>``, else ``weights``."""
    return "ema" if name.startswith(EMA_PREFIX) else "weights"


def by_family(records: list[dict], key: str = "name") -> dict[str, list[dict]]:
    """``{family: records}`` for the families present, raw weights first (``key``: the name field)."""
    out: dict[str, list[dict]] = {}
    for record in records:
        out.setdefault(family_of(record[key]), []).append(record)
    return {family: out[family] for family in FAMILIES if family in out}
