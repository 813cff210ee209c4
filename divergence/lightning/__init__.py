"""Divergence tracking for your own LightningModules.

- ``ArmCheckpoints(out, arm, every=...)``: a callback for one arm trained as its own job;
  two Trainers (two jobs) write the pair folder, ``divergence watch OUT`` builds its store.
- ``LockstepPair(module_a, module_b, out=DIR, every=N)``: both arms in one process on the
  identical batch, with the RNG forked so they draw the same noise; writes the store itself.

Both write the pair-folder contract (``docs/pair-folder.md``) that ``divergence report``,
``export`` and ``compare`` read.
"""

from divergence.lightning.arm_checkpoints import ArmCheckpoints
from divergence.lightning.lockstep import LockstepPair

__all__ = ["ArmCheckpoints", "LockstepPair"]
