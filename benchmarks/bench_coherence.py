"""Does an attention kernel's gradient error drift or wander? C(T) measured on the same weights.

    python benchmarks/bench_coherence.py [--steps 40] [--kernels sdpa-flash flash-unbiased tiled]
        [--backbone unet|dit] [--precision bf16-mixed] [--batch 4]

Trains the tiny recipe's reference arm (baseline attention, under --precision) for --steps steps.
Before each step, on the arm's own weights and batch, it computes the gradient of the loss with
every kernel of --kernels and with baseline attention, and keeps the per-step error
``e_t = g_kernel - g_baseline`` (all trainable parameters, flattened). Measured on the same
weights, e_t is free of the chaotic amplification that makes two diverged arms' weight
differences directionless. It prints, per kernel, the coherence ``C(T) = ||sum e_t|| /
sqrt(sum ||e_t||^2)`` (about 1: the error wanders; about sqrt(T): it drifts, as a biased rounding
would; ``divergence.metrics.coherence``), C at T/4 and T/2, the mean cosine of consecutive e_t
and ``|e_T| / |g_T|``. Not yet part of a study's summary.json (issue 30, item 4).
"""

import argparse
import time

import torch
import torch.nn.functional as F

from divergence.attention.kernels import get_kernel
from divergence.attention.processor import KernelAttnProcessor
from divergence.config.schema import apply_overrides, parse
from divergence.metrics.coherence import coherence, coherence_curve
from divergence.models.attention import attention_modules
from divergence.recipe.run import RunRecipe
from divergence.training.arm import Arm
from divergence.training.inputs import Inputs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--kernels", nargs="+", default=["sdpa-flash", "flash-unbiased", "tiled"])
    p.add_argument("--backbone", choices=("unet", "dit"), default="unet")
    p.add_argument("--precision", default="bf16-mixed")
    p.add_argument("--batch", type=int, default=4)
    args = p.parse_args()
    torch.set_num_threads(1)  # tiny models run fastest on one thread
    overrides = [
        "attention.name=baseline",
        f"train.precision={args.precision}",
        f"train.batch_size={args.batch}",
        "train.accelerator=cpu",
        "log.wandb=false",
        "log.progress_bar=false",
    ] + (["model.denoiser=transformer"] if args.backbone == "dit" else [])
    recipe = parse(RunRecipe, apply_overrides({}, overrides))
    inputs = Inputs(recipe)
    arm = Arm(recipe, inputs.tokenizer)
    arm.setup(torch.device("cpu"))
    arm.configure_optimizers()
    modules = attention_modules(arm.unet)
    params = arm.trainable_parameters()

    def gradient(kernel: str, batch) -> torch.Tensor:
        for module in modules.values():
            module.set_processor(KernelAttnProcessor(get_kernel(kernel)))
        loss = F.mse_loss(arm.predict(batch).float(), batch.target.float())
        return torch.cat([g.detach().double().flatten() for g in torch.autograd.grad(loss, params)])

    errors = {k: [] for k in args.kernels}
    start = time.perf_counter()
    for step in range(args.steps):
        batch = inputs.prepare(inputs.batches.batch(step))
        reference = gradient("baseline", batch)
        for kernel in args.kernels:
            errors[kernel].append(gradient(kernel, batch) - reference)
        gradient("baseline", batch)  # leave baseline processors in place for the step
        arm.training_step(batch)
    t = args.steps
    print(f"{args.backbone}, {args.precision}, batch {args.batch}, {t} steps ({time.perf_counter() - start:.0f} s):")
    for kernel, e in errors.items():
        c, curve = coherence(e), coherence_curve(e)
        print(
            f"  {kernel}: C(T) = {c['coherence']:.2f} (sqrt(T) = {t**0.5:.2f}); C(T/4) = {curve[max(0, t // 4 - 1)]:.2f}, "
            f"C(T/2) = {curve[max(0, t // 2 - 1)]:.2f}; mean cos = {c['mean_cos']:+.3f}; "
            f"|e_T| / |g_T| = {float(e[-1].norm() / reference.norm()):.3g}"
        )


if __name__ == "__main__":
    main()
