"""A comparator that follows two arms trained as separate jobs (``divergence watch DIR``).

- ``ranks``: one process, or the ranks of a torchrun launch (gloo on CPU, NCCL on GPUs);
- ``distributed``: a checkpoint pair compared with its tensors divided among the ranks;
- ``feeds``: what one arm job has written so far (status, losses, complete checkpoints);
- ``wait``, ``stalls``, ``retention``: waiting for a pair, a step that cannot come, weights kept;
- ``follow``: the loop that turns both arms' files into the metrics store, step by step.

It reads the pair-folder contract (``divergence.pairfolder``, ``divergence.store``) and logs
through ``divergence.loggers``; it imports nothing from the trainer (``training``): the
function-space probe over the arms' weights files is handed in (``Comparator(probe=...)``).
"""
