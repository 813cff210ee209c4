"""The microbench's kernels run on one torch thread: tiny tensors, and torch's default 2 threads spin on
2 busy cores (the quick sweep of test_cli took 22 s of CPU on 2 threads, 9 s on one)."""

from tests.training.tiny import one_torch_thread  # noqa: F401  (autouse; module fixtures: one_thread)
