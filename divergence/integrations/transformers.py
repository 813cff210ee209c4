"""Kept for the path the README names: the transformers callback is ``divergence.writers.transformers``."""

from divergence.writers.transformers import ArmWriterCallback  # noqa: F401  (the public path users know)
