"""A comparator that follows two arms trained as separate jobs (``divergence watch DIR``).

- ``ranks``: one process, or the ranks of a torchrun launch (gloo on CPU, NCCL on GPUs);
- ``distributed``: a checkpoint pair compared with its tensors divided among the ranks;
- ``feeds``: what one arm job has written so far (status, losses, complete checkpoints);
- ``logs``: the lockstep tracker's logger output, for the comparator's steps;
- ``follow``: the loop that turns both arms' files into the metrics store, step by step.
"""
