"""The attention numerics microbenchmark (``divergence microbench``): the paper's Figures 3-6.

Data flow: ``config`` (the recipe) -> ``inputs`` (seeded Q, K, V) -> ``sweep`` (every
implementation and configuration, one row each, scored by ``metrics`` against the fp64 golden
value and the baseline) -> ``validation`` (the re-implementation against PyTorch's real flash
kernel) -> ``figures`` and ``report`` (PNG, ``summary.md``, ``index.html``).
"""
