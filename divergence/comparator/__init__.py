"""A comparator that follows two arms trained as separate jobs (``divergence watch DIR``).

- ``ranks``: one process, or the ranks of a torchrun launch (gloo on CPU, NCCL on GPUs);
- ``distributed``: a checkpoint pair compared with its tensors divided among the ranks (``measure``:
  every rank's share of the step's checkpoint pair);
- ``feeds``: what one arm job has written so far (status, losses, complete checkpoints), and
  ``Prefetch``, the next tracked step's files read while the current one is compared;
- ``stalls``, ``retention``: a step that cannot come, weights kept;
- ``planner``: rank 0's ``Planner``: what to do next (a ``Task``: a step, a wait, done, a stop,
  the record every rank shares), and the step recorded (the store, the spikes, the logs, the
  probe, ``tracking.keep``, the progress bar);
- ``follow``: ``Comparator``, the loop that joins them, step by step, into the metrics store
  (``wait_for_pair``: waiting for a pair the arms have not started).

It reads the pair-folder contract (``divergence.pairfolder``, ``divergence.store``) and logs
through ``divergence.loggers``; it imports nothing from the trainer (``training``): the
function-space probe over the arms' weights files is handed in (``Comparator(probe=...)``).
"""
