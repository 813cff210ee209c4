"""Tiny-model tests run on one torch thread."""

from tests.training.tiny import one_torch_thread  # noqa: F401  (autouse fixture)
