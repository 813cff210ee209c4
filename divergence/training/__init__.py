"""Training: one arm, or a pair of arms in lockstep, on step-indexed inputs.

- ``inputs``: what every arm shares (data, tokenizer, latent codec, forward process);
- ``arm``: one model with its own optimizer, LR schedule, precision policy and attention;
- ``precision``, ``optim``: an arm's precision policy, optimizer, LR schedule and step counter;
- ``module``: the LightningModule of a single run (one arm);
- ``callbacks``: weights-only safetensors, the resumable .ckpt, sample grids, the pair's
  divergence tracking, attention-output deviation (shadow variant), separate-arm progress;
- ``weights``, ``checkpoint_io``, ``loggers``: files and logs of a run folder;
- ``run``: ``divergence train`` for one run (folder layout, resume, Trainer);
- ``pair``, ``pair_run``: two arms trained in lockstep on the same inputs;
- ``records``, ``spikes``, ``step_logging``: what a pair's store and loggers get at a step;
- ``arm_run``: one arm of a pair as its own (multi-GPU) job, followed by ``divergence watch``.
"""
