"""Lightning callbacks of a training run, one a file: weights checkpoints, resume checkpoints, samples."""
