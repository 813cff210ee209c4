"""Writers of the pair-folder contract (``docs/pair-folder.md``) for training loops of any kind.

- ``write_pair_files``: ``pair.json`` (defined in ``divergence.pairfolder``, the contract);
- ``ArmWriter``: one arm's side (weights at tracked steps, ``losses.jsonl``, ``status.json``)
  from a plain PyTorch, accelerate or diffusers loop.
- ``Pair``: both arms trained in one plain PyTorch loop, compared in memory into the store
  (``divergence.writers.pair``; no weights files, no ``divergence watch``).

- ``transformers.ArmWriterCallback``: the transformers ``Trainer``'s callback over ``ArmWriter``
  (``divergence.writers.transformers``, the path the README names).

Lightning users take ``divergence.lightning`` (``LockstepPair``, ``ArmCheckpoints``).
"""

from divergence.pairfolder.pair_json import CONTRACT, ensure_pair_files, write_pair_files
from divergence.writers.arm_writer import ArmWriter
from divergence.writers.pair import Pair

__all__ = ["CONTRACT", "ArmWriter", "Pair", "ensure_pair_files", "write_pair_files"]
