"""The text of the job scripts: one per arm and one for the comparator, plus a driver.

SLURM (Lightning's conventions, https://lightning.ai/docs/pytorch/stable/clusters/cluster_advanced.html):
one task per GPU (``--ntasks-per-node`` = ``--gres=gpu:G`` = ``train.devices``), ``srun``
starting every task, ``train.num_nodes`` = ``--nodes``; Lightning reads the ranks from
SLURM's environment. ``--signal=SIGUSR1@120`` with ``--requeue`` lets Lightning requeue a job
about to hit its time limit; the requeued arm resumes from the newest of its ``last.ckpt`` and
the ``hpc_ckpt_N.ckpt`` Lightning writes on that signal, and the comparator follows the new
attempt. The comparator job is requeueable too: its batch shell gets the signal (``B:USR1``),
requeues the job and stops ``watch``, which resumes from its store when it starts again; on
SIGTERM (preemption, ``scancel``) it stops ``watch`` and exits cleanly. With
``comparator_cpu`` it asks for no GPU and compares on CPU. ``--cpus-per-task``, ``--mem``,
free ``#SBATCH`` lines and a pyxis ``--container-image`` (on every ``srun``, with the pair
folder and the recipe's folder mounted at the same paths; neither may then hold ``,`` or ``:``,
which pyxis's mount list cannot escape) apply to every job. In ``#SBATCH --output`` a ``%`` of
the pair folder is written ``%%`` (sbatch reads ``%j`` there as the job id).
``submit.sh`` submits the arms, then the comparator with
``--dependency=after:A:B`` (it starts once both arms have started, and follows them). Every
script exports one ``WANDB_RUN_GROUP`` (``--group``, default the pair folder's name), so the
three wandb runs land in one group.

Nothing reaches a script raw: every shell word is quoted (``shlex.quote``, ``--command`` split
into words and each quoted), comments and ``echo`` lines hold only names that follow
``divergence.recipe.names``' rule, and a value written into an ``#SBATCH`` line (which sbatch
reads itself: a newline would end the header, a quote change how it splits) must follow
``SBATCH_VALUE``; ``LaunchPlan`` refuses anything else on construction, naming the flag.

torchrun: ``torchrun --nnodes N --nproc-per-node G`` per arm. On one node the arms get
disjoint GPUs (``CUDA_VISIBLE_DEVICES``) and their own rendezvous ports, and ``start.sh``
runs both arms and the comparator there; on several nodes each arm script runs on each of
its nodes with ``NODE_RANK`` and ``MASTER_ADDR`` set.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from divergence.errors import UserInputError
from divergence.pairfolder.layout import ARMS
from divergence.recipe.names import check_name
from divergence.config.yaml_safe import short

# What a value in an #SBATCH line may hold: what SLURM's values use (partitions, times, memory,
# constraints such as a100&nvlink, node lists such as node[01-04], paths), and nothing that ends
# the line or changes how sbatch splits it (whitespace, quotes, backslash, #).
SBATCH_VALUE = re.compile(r"[\w.:,+=@/%&|\[\]*!~^()-]+")
SBATCH_ALLOWED = "letters, digits and . : , + = @ / % & | [ ] * ! ~ ^ ( ) -"
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
MASTER_PORT = 29500  # arm a's torchrun rendezvous port; arm b's the next


@dataclass(frozen=True)
class LaunchPlan:
    """What to launch and where; paths absolute (the jobs may start in another directory)."""

    recipe: Path
    out: Path
    name: str  # the pair's name, for job names
    scheduler: str = "slurm"
    nodes: int = 1  # nodes per arm
    gpus_per_node: int = 1  # processes (GPUs) per node per arm
    accelerator: str = "gpu"  # gpu, or cpu (gloo; for trying the scripts without GPUs)
    strategy: str = "ddp"
    comparator_gpus: int = 1  # ranks of the comparator (torchrun inside its job when > 1)
    overrides: tuple[str, ...] = ()
    command: str = "divergence"  # how the jobs call divergence (e.g. "python -m divergence")
    partition: str | None = None
    time: str | None = None  # SLURM time limit, e.g. 2-00:00:00
    account: str | None = None
    extra_sbatch: tuple[str, ...] = field(default_factory=tuple)
    group: str | None = None  # wandb group of the three jobs (default: the pair folder's name)
    comparator_cpu: bool = False  # the comparator job asks for no GPU and compares on CPU
    cpus_per_task: int | None = None  # SLURM --cpus-per-task of every job
    mem: str | None = None  # SLURM --mem of every job (per node), e.g. 200G
    container_image: str | None = None  # pyxis/enroot image every srun runs in

    def __post_init__(self):
        for flag, value in (
            ("--partition", self.partition),
            ("--time", self.time),
            ("--account", self.account),
            ("--mem", self.mem),
            ("job name", self.name),
        ):
            if value is not None:
                sbatch_value(value, flag)
        for option in self.extra_sbatch:
            for part in option.removeprefix("--").split("=", 1):
                sbatch_value(part, "--sbatch")
        if self.group is not None:
            check_name(self.group, "--group", "wandb group", "the jobs' wandb group")
        for flag, value in (
            ("--out", str(self.out)),
            ("--recipe", str(self.recipe)),
            ("--container-image", self.container_image or ""),
            ("--strategy", self.strategy),
            ("--command", self.command),
        ):
            if CONTROL.search(value):
                raise UserInputError(
                    f"{flag} {short(value)}: holds a control character (a newline?); "
                    "a value written into a job script may not"
                )
        if self.scheduler == "slurm":
            sbatch_value(str(self.log_dir), "--out")  # in every #SBATCH --output= line
        if self.container_image:  # pyxis's --container-mounts list splits on , and : and has no escape
            for flag, folder in (("--out", str(self.out)), ("--recipe", str(self.recipe.parent))):
                if "," in folder or ":" in folder:
                    raise UserInputError(
                        f"{flag} {short(folder)}: the folder holds ',' or ':', which cannot stand in pyxis's "
                        "--container-mounts list (SRC:DST,...); with --container-image choose a folder without them"
                    )
        self.command_words  # noqa: B018 - refuses a --command that is not words

    @property
    def command_words(self) -> list[str]:
        """``command`` as the words it stands for (``python -m divergence``): each is quoted in a script."""
        try:
            words = shlex.split(self.command)
        except ValueError as err:
            raise UserInputError(
                f"--command {short(self.command)}: {err}; give the words of a command, e.g. 'python -m divergence'"
            ) from None
        if not words:
            raise UserInputError("--command is empty; give how the jobs call divergence, e.g. 'python -m divergence'")
        return words

    def train_args(self, arm: str) -> list[str]:
        return [
            "train",
            "--recipe",
            str(self.recipe),
            "--arm",
            arm,
            "--out",
            str(self.out),
            f"train.accelerator={self.accelerator}",
            f"train.devices={self.gpus_per_node}",
            f"train.num_nodes={self.nodes}",
            f"train.strategy={self.strategy}",
            *self.overrides,
        ]

    def watch_args(self) -> list[str]:
        return ["watch", str(self.out), "--poll", "30", "--device", "cuda" if self.watch_gpus else "cpu"]

    @property
    def watch_gpus(self) -> bool:
        return self.accelerator == "gpu" and not self.comparator_cpu

    @property
    def launch_dir(self) -> Path:
        return self.out / "launch"

    @property
    def log_dir(self) -> Path:
        return self.out / "logs"


def build_scripts(plan: LaunchPlan) -> dict[str, str]:
    """``{file name: text}`` for ``plan.scheduler``: both arms, the comparator, then the driver script."""
    if plan.scheduler == "slurm":
        arm, suffix, jobs = _sbatch_arm, ".sbatch", {"watch.sbatch": _sbatch_watch(plan), "submit.sh": _submit(plan)}
    else:
        arm, suffix, jobs = _torchrun_arm, ".sh", {"watch.sh": _torchrun_watch(plan), "start.sh": _start(plan)}
    return {**{f"arm-{a}{suffix}": arm(plan, a) for a in ARMS}, **jobs}


# -- SLURM ---------------------------------------------------------------------------------------
def sbatch_header(plan: LaunchPlan, job: str, nodes: int, tasks: int, gpus: int) -> list[str]:
    """The ``#SBATCH`` lines of job ``job``; ``gpus`` 0: a job that asks for no GPU. Every value in
    them passed ``SBATCH_VALUE`` when the plan was made."""
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={plan.name}-{job}",
        f"#SBATCH --nodes={nodes}",
        f"#SBATCH --ntasks-per-node={tasks}",
    ]
    if gpus:
        lines.append(f"#SBATCH --gres=gpu:{gpus}")
    lines.append(f"#SBATCH --output={str(plan.log_dir).replace('%', '%%')}/{job}-%j.out")  # %j: the job id
    for name in ("cpus_per_task", "mem", "partition", "time", "account"):  # each the sbatch option of its name
        if getattr(plan, name):
            lines.append(f"#SBATCH --{name.replace('_', '-')}={getattr(plan, name)}")
    lines += [f"#SBATCH {option}" for option in plan.extra_sbatch]
    return lines


def _sbatch_arm(plan: LaunchPlan, arm: str) -> str:
    gpus = plan.gpus_per_node if plan.accelerator == "gpu" else 0
    return script(
        plan,
        [
            *sbatch_header(plan, f"arm-{arm}", plan.nodes, plan.gpus_per_node, gpus),
            "#SBATCH --signal=SIGUSR1@120  # Lightning saves and requeues before the time limit",
            "#SBATCH --requeue",
        ],
        [f"# arm {arm} of {plan.name}: {plan.nodes} node(s) x {plan.gpus_per_node} task(s), one per GPU"],
        [f"{srun_prefix(plan)} {command_line(plan, plan.train_args(arm))}"],
    )


def _sbatch_watch(plan: LaunchPlan) -> str:
    head = sbatch_header(plan, "watch", 1, 1, plan.comparator_gpus if plan.watch_gpus else 0)
    comments = [
        "# the comparator: follows both arms in the pair folder until the pair is complete.",
        "# USR1 (to this shell, 120 s before the time limit): requeue the job and stop watch; TERM: stop it.",
        "# Started again, watch continues from its store (and waits for the arms' folder if need be).",
    ]
    body = [
        'stop() { kill -TERM "$child" 2>/dev/null || true; wait "$child" 2>/dev/null || true; exit 0; }',
        'trap \'echo "requeueing job $SLURM_JOB_ID"; scontrol requeue "$SLURM_JOB_ID"; stop\' USR1',
        "trap stop TERM",
        f"{srun_prefix(plan)} {_watch_command(plan)} &",
        "child=$!",
        "status=0",
        'wait "$child" || status=$?',
        'exit "$status"',
    ]
    return script(plan, [*head, "#SBATCH --signal=B:USR1@120", "#SBATCH --requeue"], comments, body)


def _submit(plan: LaunchPlan) -> str:
    return "\n".join(
        [
            "#!/bin/bash",
            "# Submits both arms, then the comparator once both have started (it follows them as they train).",
            "set -euo pipefail",
            f"mkdir -p {shlex.quote(str(plan.log_dir))}",
            *submit_lines(plan),
            'echo "arm a: job $a  arm b: job $b  comparator: job $w"',
            "",
        ]
    )


def submit_lines(plan: LaunchPlan) -> list[str]:
    """Submit the pair's arms, then its comparator ``after`` both have started; their job ids in
    ``$a``, ``$b`` and ``$w`` (``sbatch --parsable`` prints ID or ID;CLUSTER)."""
    here = shlex.quote(str(plan.launch_dir))
    return [
        f"a=$(sbatch --parsable {here}/arm-a.sbatch); a=${{a%%;*}}",
        f"b=$(sbatch --parsable {here}/arm-b.sbatch); b=${{b%%;*}}",
        f"w=$(sbatch --parsable --dependency=after:$a:$b {here}/watch.sbatch); w=${{w%%;*}}",
    ]


# -- torchrun ------------------------------------------------------------------------------------
def _torchrun_arm(plan: LaunchPlan, arm: str) -> str:
    index, g = ARMS.index(arm), plan.gpus_per_node
    comments = [f"# arm {arm} of {plan.name}: {plan.nodes} node(s) x {g} process(es)"]
    body = []
    if plan.accelerator == "gpu" and plan.nodes == 1:
        devices = ",".join(str(index * g + i) for i in range(g))
        body.append(f"# one node holds both arms: arm {arm} takes GPUs {devices}")
        body.append(f"export CUDA_VISIBLE_DEVICES=${{CUDA_VISIBLE_DEVICES_{arm.upper()}:-{devices}}}")
    rendezvous = [
        f"--nnodes={plan.nodes}",
        f"--nproc-per-node={g}",
        "--node-rank=${NODE_RANK:-0}",
        "--master-addr=${MASTER_ADDR:-127.0.0.1}",
        f"--master-port=${{MASTER_PORT_{arm.upper()}:-{MASTER_PORT + index}}}",
    ]
    body.append(f"exec torchrun {' '.join(rendezvous)} -m divergence {_join(plan.train_args(arm))}")
    return script(plan, ["#!/bin/bash"], comments, body)


def _torchrun_watch(plan: LaunchPlan) -> str:
    body = []
    if plan.watch_gpus and plan.nodes == 1:
        # it holds one tensor pair at a time per rank: sharing the arms' first GPUs costs them little
        devices = ",".join(str(i) for i in range(plan.comparator_gpus))
        body.append(f"export CUDA_VISIBLE_DEVICES=${{CUDA_VISIBLE_DEVICES_WATCH:-{devices}}}")
    body.append(f"exec {_watch_command(plan)}")
    return script(plan, ["#!/bin/bash"], ["# the comparator: follows both arms in the pair folder"], body)


def _start(plan: LaunchPlan) -> str:
    here, logs = shlex.quote(str(plan.launch_dir)), shlex.quote(str(plan.log_dir))
    return "\n".join(
        [
            "#!/bin/bash",
            "# Runs both arms and the comparator on this node; stops the arms if this script is stopped.",
            "set -euo pipefail",
            f"mkdir -p {logs}",
            f"bash {here}/arm-a.sh > {logs}/arm-a.log 2>&1 &",
            "a=$!",
            f"bash {here}/arm-b.sh > {logs}/arm-b.log 2>&1 &",
            "b=$!",
            'trap \'kill "$a" "$b" 2>/dev/null || true\' INT TERM',
            "status=0",
            f"bash {here}/watch.sh || status=$?",
            'wait "$a" || status=$?',
            'wait "$b" || status=$?',
            'exit "$status"',
            "",
        ]
    )


# -- helpers -------------------------------------------------------------------------------------
def sbatch_value(value: str, flag: str) -> str:
    """``value`` if it may stand in an ``#SBATCH`` line, else a one-line error naming ``flag``."""
    if not SBATCH_VALUE.fullmatch(value) or value.startswith("-"):
        raise UserInputError(
            f"{flag} {short(value)}: cannot stand in an #SBATCH line; use {SBATCH_ALLOWED} "
            "(no spaces, quotes or newlines, no leading '-')"
        )
    return value


def srun_prefix(plan: LaunchPlan) -> str:
    """``srun``, in the container when one is given (pyxis), the folders the job reads and writes
    mounted at the same paths."""
    if not plan.container_image:
        return "srun"
    mounts = ",".join(f"{p}:{p}" for p in dict.fromkeys((str(plan.out), str(plan.recipe.parent))))
    return f"srun --container-image={shlex.quote(plan.container_image)} --container-mounts={shlex.quote(mounts)}"


def script(plan: LaunchPlan, head: list[str], comments: list[str], body: list[str]) -> str:
    """A job script: ``head`` (the shebang, any ``#SBATCH`` lines), strict mode, ``comments``, the
    wandb group (one for the three jobs; a WANDB_RUN_GROUP the user exported wins, and a recipe's
    ``log.group`` wins over both, see ``divergence.loggers.wandb_mode``), then ``body``."""
    group = f"export WANDB_RUN_GROUP=${{WANDB_RUN_GROUP:-{shlex.quote(plan.group or plan.out.name)}}}"
    return "\n".join([*head, "set -euo pipefail", *comments, group, *body, ""])


def _watch_command(plan: LaunchPlan) -> str:
    """The comparator's command; with several ranks under torchrun, which starts Python itself
    (``-m divergence``, whatever ``plan.command`` is)."""
    if plan.comparator_gpus > 1:
        return f"torchrun --standalone --nproc-per-node={plan.comparator_gpus} -m divergence {_join(plan.watch_args())}"
    return command_line(plan, plan.watch_args())


def command_line(plan: LaunchPlan, args: list[str]) -> str:
    return _join([*plan.command_words, *args])


def _join(args: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in args)
