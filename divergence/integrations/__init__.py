"""Kept for the public path ``divergence.integrations.transformers`` (README); the writers live in
``divergence.writers`` (``divergence.writers.transformers.ArmWriterCallback``)."""
