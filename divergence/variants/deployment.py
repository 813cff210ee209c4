"""Deployment numerics: where a variant is used, and the numerics each arm of a pair trains in.

Measure an optimization where it runs (``docs/method.md``, "Deployment numerics"). Flash attention
kernels exist on GPUs for fp16/bf16 inputs only, so wherever they are deployed training runs
under fp16/bf16 autocast; with both arms in fp32 the flash-vs-baseline difference is fp32
rounding between two other kernels, and its dose ratio against bf16 (-3.8 dex on the tiny
recipe, against -0.04 to -0.56 under bf16 autocast) answers a question no GPU user has. TF32 is
a CUDA setting: on a CPU its arms compute alike.

A variant states its deployment (``Variant.deployment``): the training precisions it is used
in (preferred first) and the device types it runs on. From them:

- ``deployment_precision``: the precision a study trains its pair under study in (the base's
  when it is one of them, else the variants' first choice);
- ``arm_numerics``: what an arm trains in, as plain data (``pair.json``'s ``numerics``);
- ``outside_deployment``: one line when an arm trains a variant outside its deployment
  (``pair.json``'s ``outside_deployment``, a caveat in the report), else None.

>>> d = Deployment("sdpa-flash", precisions=("bf16-mixed", "16-mixed"))
>>> d.outside({"precision": "32-true", "device": "cpu"})
'sdpa-flash is used under bf16-mixed or 16-mixed autocast, but trains here in 32-true'
>>> d.outside({"precision": "bf16-mixed", "device": "cpu"}) is None
True
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Deployment:
    """The numerics a variant is used in where it is deployed."""

    what: str  # what is deployed, as messages name it ("sdpa-flash", "tf32")
    precisions: tuple[str, ...] = ()  # training precisions it is used in, preferred first; (): any
    devices: tuple[str, ...] = ()  # device types it runs on ("cuda"); (): any

    def outside(self, numerics: dict) -> str | None:
        """Why an arm training in ``numerics`` (``precision``, ``device``) is outside this deployment."""
        if self.precisions and numerics.get("precision") not in self.precisions:
            return (
                f"{self.what} is used under {' or '.join(self.precisions)} autocast, but trains here in "
                f"{numerics.get('precision')}"
            )
        if self.devices and numerics.get("device") not in self.devices:
            return (
                f"{self.what} is a {' or '.join(self.devices)} setting, but trains here on a "
                f"{numerics.get('device')}, where it changes nothing"
            )
        return None


def deployment_precision(variants, base_precision: str) -> str | None:
    """The precision to train a pair in, from its variants' deployments: None when the base's
    ``base_precision`` serves every variant (or none states one), else the first preferred one."""
    wanted = [d.precisions for d in (v.deployment() for v in variants) if d is not None and d.precisions]
    if not wanted or all(base_precision in p for p in wanted):
        return None
    return next((p for p in wanted[0] if all(p in w for w in wanted)), wanted[0][0])


def arm_numerics(recipe) -> dict:
    """What an arm trains in, as ``pair.json`` records it::

        {"device": "cpu", "precision": "bf16-mixed", "attention": "sdpa-flash", "tf32": false,
         "deterministic": true, "cpu_threads": 1, "cpu_autocast": "emulate"}

    ``device``: ``cuda`` or ``cpu`` as ``train.accelerator`` says (auto: cuda when one is
    available); ``cpu_threads``: ``train.cpu_threads``, or torch's default (one per core here) when
    it is 0; ``cpu_autocast`` (``train.cpu_autocast``): None where it changes nothing (fp32, or a GPU).
    """
    import torch

    train = recipe.train
    auto = "cuda" if train.accelerator not in ("gpu", "cpu") and torch.cuda.is_available() else "cpu"
    device = "cuda" if train.accelerator == "gpu" else auto
    return {
        "device": device,
        "precision": train.precision,
        "attention": recipe.attention.name,
        "tf32": bool(train.tf32),
        "deterministic": bool(train.deterministic),
        "cpu_threads": int(train.cpu_threads or torch.get_num_threads()),
        "cpu_autocast": train.cpu_autocast if device == "cpu" and train.precision != "32-true" else None,
    }


def outside_deployment(arms: dict, numerics: dict) -> str | None:
    """One line naming every arm that trains a variant outside its deployment, or None.

    ``arms``: arm -> its variants; ``numerics``: arm -> ``arm_numerics``."""
    found = {}
    for arm, variants in arms.items():
        for variant in variants:
            deployment = variant.deployment()
            why = deployment.outside(numerics[arm]) if deployment is not None else None
            if why:
                found.setdefault(why, []).append(arm)
    if not found:
        return None
    return "; ".join(f"{why} (arm {' and '.join(arms_)})" for why, arms_ in found.items())
