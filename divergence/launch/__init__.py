"""Job scripts for a pair trained as separate jobs: both arms and the comparator that follows them.

- ``scripts``: the scripts' text for SLURM (``sbatch``, Lightning's SLURM conventions) and
  for ``torchrun`` (one node, or each node of a multi-node job);
- ``submit``: writing them under ``DIR/launch`` and submitting (sbatch) or starting them.
"""
