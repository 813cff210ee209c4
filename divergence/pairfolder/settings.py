"""What a pair folder records of how it is followed: ``pair.json``'s ``tracking`` and ``log``.

The types the recipes use for their ``tracking:`` and ``log:`` sections and the readers of a
pair folder parse ``pair.json`` into (``divergence.pairfolder.schedule``), and the one rule of
which steps are compared (``is_tracked``) and probed (``probe_due``): the lockstep trackers,
the separate arm's tracked weights, the writers for other trainers and the comparator all
call it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from divergence.config.schema import require

# The default dense early schedule: every step to 20, every 5th step to 100 (then tracking.every).
DENSE_DEFAULT = ((20, 1), (100, 5))
# The spike rule's defaults: a loss above SPIKE_FACTOR x its running median over SPIKE_WINDOW steps.
SPIKE_FACTOR, SPIKE_WINDOW = 3.0, 20


@dataclass(frozen=True)
class ProbeConfig:
    """The function-space probe: a fixed set of inputs both arms are evaluated on at tracked steps."""

    # Evaluate both arms on the probe at the tracked steps ``every`` picks (fp32, baseline attention, no autocast).
    enabled: bool = True
    # Items (image, noise, timestep, caption) in the probe set.
    size: int = 64
    # Seed of the probe set (replicate r uses replicate_seed(seed, r)).
    seed: int = 0
    # Items per forward pass (bounds the probe's memory). 16 keeps the baseline attention's score
    # matrices small: 2-20% faster than 64 on CPU, bitwise the same outputs on the tiny recipe.
    batch_size: int = 16
    # Evaluate at tracked steps that are multiples of ``every`` (and at the last step); 1: at every
    # tracked step. One evaluation of 64 items costs ~1.5 pair steps on the tiny recipe, so 20 keeps
    # the probe under 10% of training time at any horizon; the weight-space metrics stay at every
    # tracked step. Choose a multiple of ``tracking.every`` (other steps are not tracked late on).
    every: int = 20

    def __post_init__(self):
        require(self.size >= 1, "size", f"must be >= 1, got {self.size}")
        require(self.batch_size >= 1, "batch_size", f"must be >= 1, got {self.batch_size}")
        require(self.seed >= 0, "seed", f"must be >= 0, got {self.seed}")
        require(self.every >= 1, "every", f"must be >= 1, got {self.every}")


@dataclass(frozen=True)
class TrackingConfig:
    """How the divergence between the arms is measured and flagged while they train."""

    # Compare the two arms' weights every N steps (and always at step 0, at checkpoint steps, at
    # the last step and on the dense early schedule).
    every: int = 10
    # Dense early tracking on top of ``every``: [[until, every], ...] with increasing ``until``; a
    # step up to the first ``until`` is also tracked every first ``every`` steps, and so on;
    # [] turns it off. Decided by is_tracked below.
    dense: tuple[tuple[int, int], ...] = DENSE_DEFAULT
    # Compare on this device: ``auto`` is where the weights live.
    device: str = "auto"
    # A loss above spike_factor x its running median over spike_window steps is a spike.
    spike_factor: float = SPIKE_FACTOR
    # Steps in the running median of the spike rule (the first spike_window steps are never flagged).
    spike_window: int = SPIKE_WINDOW
    # With the shadow attention variant: log attention-output deviation every N steps.
    attention_every: int = 10
    # Every N steps, the update error of arm a's optimization on arm b's own weights and batch (the
    # gradient with it on minus off) and its coherence C(T) (divergence.training.callbacks.coherence;
    # docs/method.md, "Coherence"); 0: off. Costs two forward and backward passes of one arm.
    coherence_every: int = 0
    # The function-space probe (its keys in the store: probe_rel_diff, probe_loss_a, probe_loss_b).
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    # Separate arm jobs: once a tracked step is compared and stored, ``divergence watch`` deletes
    # both arms' weights files of it but every keep-th tracked step's and the last's
    # (divergence.comparator.retention); 0 or null keeps them all.
    keep: int | None = None

    def __post_init__(self):
        require(self.every >= 1, "every", f"must be >= 1, got {self.every}")
        require(self.keep is None or self.keep >= 0, "keep", f"must be >= 0 or null, got {self.keep}")
        ends = [until for until, _ in self.dense] if all(len(d) == 2 for d in self.dense) else None
        require(
            ends is not None and ends == sorted(set(ends)) and all(e >= 1 for d in self.dense for e in d),
            "dense",
            f"expected [[until, every], ...] with increasing until >= 1 and every >= 1, "
            f"got {[list(d) for d in self.dense]}",
        )
        require(self.spike_factor > 1, "spike_factor", f"must be > 1, got {self.spike_factor}")
        require(self.spike_window >= 3, "spike_window", f"must be >= 3, got {self.spike_window}")
        require(self.attention_every >= 1, "attention_every", f"must be >= 1, got {self.attention_every}")
        require(self.coherence_every >= 0, "coherence_every", f"must be >= 0 (0: off), got {self.coherence_every}")


@dataclass(frozen=True)
class LogConfig:
    """Where metrics go. The user's own wandb settings win (see ``divergence.loggers.wandb_mode``):
    online with WANDB_MODE=online, WANDB_API_KEY or ``wandb login``; offline otherwise."""

    wandb: bool = True
    # wandb project (null: $WANDB_PROJECT, else "divergence").
    project: str | None = None
    # wandb entity, a user or team (null: $WANDB_ENTITY, else the user's default entity).
    entity: str | None = None
    # wandb group of every run of a study or pair (null: $WANDB_RUN_GROUP, else the study or
    # pair folder's name).
    group: str | None = None
    # Extra wandb tags, after the pair, category, replicate and variant tags.
    tags: tuple[str, ...] = ()
    # Also log one scalar per module and metric (divergence/wasserstein/<module>, ...): about
    # a thousand wandb panels for an SD-1.5-sized model. Off: per-layer values go out as the
    # layers x steps heatmaps and the per-layer tables.
    per_layer_scalars: bool = False
    # Steps whose weights-only checkpoints are logged as wandb artifacts (type "model") when the
    # run finishes; empty: none.
    artifacts: tuple[int, ...] = ()
    csv: bool = True
    tensorboard: bool = False
    # Log the loss every N steps.
    every_n_steps: int = 1
    # Show a progress bar.
    progress_bar: bool = True

    def __post_init__(self):
        require(self.every_n_steps >= 1, "every_n_steps", "must be >= 1")
        for key in ("project", "entity", "group"):
            value = getattr(self, key)
            require(
                value is None or (isinstance(value, str) and value.strip() != ""),
                key,
                f"must be a non-empty name or null, got {value!r}",
            )
        require(
            all(isinstance(t, str) and 0 < len(t) <= 64 for t in self.tags),
            "tags",
            f"each tag must be a string of 1 to 64 characters, got {list(self.tags)}",
        )
        require(
            all(isinstance(s, int) and s >= 0 for s in self.artifacts),
            "artifacts",
            f"must be a list of steps >= 0, got {list(self.artifacts)}",
        )


def is_tracked(step: int, max_steps: int, tracking, checkpoint_every: int) -> bool:
    """Whether the arms are compared at ``step``: the one rule of the lockstep tracker, the
    separate arm's tracked weights and the comparator that follows separate arms.

    Tracked: step 0, every ``tracking.every`` steps, the dense early schedule on top
    (``tracking.dense``: ``[[20, 1], [100, 5]]`` by default: every step up to 20, every 5th up
    to 100; it adds steps, never removes one), every checkpoint step and the last step.

    >>> [s for s in range(131) if is_tracked(s, 130, TrackingConfig(every=10), 0)][18:]
    [18, 19, 20, 25, 30, 35, 40, 45, 50, 55, 60, 65, 70, 75, 80, 85, 90, 95, 100, 110, 120, 130]
    """
    at_checkpoint = bool(checkpoint_every) and step % checkpoint_every == 0
    if step == 0 or at_checkpoint or step == max_steps or step % tracking.every == 0:
        return True
    for until, every in tracking.dense:
        if step <= until:
            return step % every == 0
    return False


def probe_due(step: int, max_steps: int, config) -> bool:
    """Whether a tracked ``step`` gets the function-space probe (``config``: the recipe's
    ``tracking.probe``): multiples of ``config.every`` and the last step.

    >>> [s for s in range(0, 51, 5) if probe_due(s, 50, ProbeConfig(every=20))]
    [0, 20, 40, 50]
    """
    return config.enabled and (step % config.every == 0 or step == max_steps)
