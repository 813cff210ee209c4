"""What a pair's tracker records and logs at a step, wherever the step is measured.

The lockstep tracker (``pair_tracker``: the built-in trainer's pairs, ``LockstepPair``,
``divergence.Pair``), ``divergence watch`` (separate arm jobs) and ``divergence track`` (two
checkpoint series) all build their store records and log keys here, so their stores and logs
are identical record for record:

- ``records``: the step's store records (which steps are tracked is
  ``divergence.pairfolder.settings.is_tracked``);
- ``spikes``: the loss-spike rule (``SpikeDetector``).

The logging keys and how a step goes to the loggers are ``divergence.loggers.step_logging``'s.

It imports nothing from the training package.
"""
