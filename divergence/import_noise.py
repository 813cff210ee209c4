"""Warnings other packages print when they are imported here, that say nothing about a run.

With the ``fp8`` extra installed, torchao is imported by every run (diffusers' and transformers'
quantizer registries import it when a model class is first used), and three libraries then write to stderr:

- torchao: "Failed to load .../torchao/_C_mxfp8...so" and "..._C_cutlass_90a.so": CUDA kernels
  for MX formats and Hopper that a CPU build cannot load and that the FP8 / INT8 training here
  never calls (it uses ``torch._scaled_mm`` or the emulated arithmetic);
- torchao (``torchao.kernel.intmm``): "Warning: Detected no triton ...", said where Triton is not
  installed (a CPU build), about torchao's Triton integer matmuls, which the INT8 training here does
  not use on a CPU (``divergence.models.int8_matmul``); a CUDA build of torch brings Triton. Python
  shows it whenever the user's script configures logging (``logging.basicConfig()``);
- torch (``torch.utils._pytree``): "<enum ...> is an Enum subclass and is now natively supported
  by torch.compile ...", a deprecation notice addressed to torchao's authors;
- diffusers (its torchao quantizer): "Unable to import `torchao` Tensor objects. This may affect
  loading checkpoints serialized with `torchao`": checkpoints quantized by torchao, which this
  package does not load.

``silence_import_noise`` drops exactly those messages (a ``logging.Filter`` on each of those
loggers, matching the message's start); everything else those loggers say still shows. It only
touches ``logging``: nothing is imported.
"""

from __future__ import annotations

import logging

# logger name -> the starts of the messages dropped from it
NOISE = {
    "torchao": ("Failed to load ",),
    "torchao.kernel.intmm": ("Warning: Detected no triton",),
    "torch.utils._pytree": ("%s is an Enum subclass and is now natively supported",),
    "diffusers.quantizers.torchao.torchao_quantizer": ("Unable to import `torchao` Tensor objects",),
}


class _Drop(logging.Filter):
    def __init__(self, starts: tuple[str, ...]):
        super().__init__()
        self.starts = starts

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith(self.starts))


def silence_import_noise() -> None:
    """Install the filters (once; calling again changes nothing)."""
    for name, starts in NOISE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Drop) for f in logger.filters):
            logger.addFilter(_Drop(starts))
