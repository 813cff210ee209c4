"""Training: arms ``{name: Arm}`` in one LightningModule, on step-indexed inputs.

- ``inputs``: what every arm shares (data, tokenizer, latent codec, forward process);
- ``arm``: one model with its own optimizer, LR schedule, precision policy and attention;
- ``precision``, ``optim``: an arm's precision policy, optimizer, LR schedule and step counter;
- ``arms_module``: the one LightningModule (a single run is one arm, a lockstep pair two, a
  separate arm one), its global (rank-averaged) losses and its non-finite-loss rule;
- ``fit``: the one Trainer setup and fit, resuming from ``resume/last.ckpt``;
- ``folder_check``: the one "may this folder be trained or resumed by this command" check;
- ``single``, ``lockstep``, ``separate_arm``: ``divergence train`` for a run, for a pair in one
  job, and for one arm of a pair as its own (multi-GPU) job followed by ``divergence watch``;
- ``pair_setup``: a pair's module, ``pair.yaml`` and ``pair.json``;
- ``callbacks``: weights-only safetensors, the resumable .ckpt, sample grids, the pair's
  divergence tracking, attention-output deviation (shadow variant), separate-arm progress;
- ``weights``, ``checkpoint_io``, ``loggers``: files and logs of a run folder;
- ``records``, ``spikes``, ``step_logging``: what a pair's store and loggers get at a step.
"""
