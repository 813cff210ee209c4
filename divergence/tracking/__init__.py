"""What a pair's tracker records and logs at a step, wherever the step is measured.

The lockstep trackers (the built-in trainer's ``DivergenceTracker``, ``divergence.lightning``'s
``LockstepPair``), ``divergence watch`` (separate arm jobs) and ``divergence track`` (two
checkpoint series) all build their store records and log keys here, so their stores and logs
are identical record for record:

- ``records``: which steps are tracked (``is_tracked``) and the step's store records;
- ``spikes``: the loss-spike rule (``SpikeDetector``);
- ``step_logging``: the logging keys and how a step goes to the loggers;
- ``layer_heatmap``: the layers x steps heatmap logged at table steps.

It imports nothing from the training package.
"""
