"""Training: arms ``{name: Arm}`` in one LightningModule, on step-indexed inputs.

- ``inputs``: what every arm shares (data, tokenizer, latent codec, forward process);
- ``arm``: one model with its own optimizer, LR schedule, precision policy and attention;
- ``precision``, ``optim``: an arm's precision policy, optimizer, LR schedule and step counter;
- ``arms_module``: the one LightningModule (a single run is one arm, a lockstep pair two, a
  separate arm one), its global (rank-averaged) losses and its non-finite-loss rule;
- ``fit``: the one Trainer setup and fit, resuming from ``resume/last.ckpt`` (or ``hpc_ckpt_N.ckpt``);
- ``folder_check``: the one "may this folder be trained or resumed by this command" check;
- ``single``, ``lockstep``, ``separate_arm``: ``divergence train`` for a run, for a pair in one
  job, and for one arm of a pair as its own (multi-GPU) job followed by ``divergence watch``;
- ``pair_setup``: a pair's module, ``pair.yaml`` and ``pair.json``;
- ``probe``: the function-space probe a lockstep pair evaluates at tracked steps;
- ``callbacks``: weights-only safetensors, the resumable .ckpt, SLURM requeue, sample grids, the
  pair's divergence tracking, attention-output deviation (shadow variant), separate-arm progress;
- ``checkpoint_io``: the resume files (written atomically, loaded weights-only).

What a pair's store and loggers get at a step (records, spikes, logging keys) lives in
``divergence.tracking``, and every file name of a pair folder in ``divergence.pairfolder``: the
comparator (``divergence watch``) imports those, nothing from here.
"""
