"""A SLURM requeue: the signal writes Lightning's HPC checkpoint, the job is requeued, and the
next attempt resumes from that checkpoint, not from the older ``last.ckpt``, and removes it."""

import os
import signal
import subprocess
import sys

from lightning.pytorch.callbacks import Callback

from divergence.training.callbacks.resume import HPC_NAME, drop_superseded, resume_file
from divergence.training.checkpoint_io import load_resume_state

# one tiny run; at step SIGNAL_AT the job signals itself as SLURM would (--signal=SIGUSR1@120)
MAX_STEPS, CHECKPOINT_EVERY, SIGNAL_AT = 6, 2, 3


class Probe(Callback):
    """Notes each attempt's first step in ``out/started_at``; at step ``signal_at`` sends SIGUSR1 to itself."""

    def __init__(self, out, signal_at: int):
        self.out, self.signal_at = out, signal_at

    def on_train_start(self, trainer, pl_module):
        with open(os.path.join(self.out, "started_at"), "a") as f:
            f.write(f"{trainer.global_step}\n")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.signal_at:
            os.kill(os.getpid(), signal.SIGUSR1)


def run_job(out: str, signal_at: int) -> None:
    from divergence.training.single import train_run
    from tests.training.tiny import tiny_recipe

    recipe = tiny_recipe(
        "model.denoiser=transformer",  # the tiny DiT: a quarter of the UNet's CPU a step
        f"train.max_steps={MAX_STEPS}",
        f"train.checkpoint_every={CHECKPOINT_EVERY}",
        "sample.enabled=false",
        "log.csv=false",
        "log.tensorboard=false",
        "train.cpu_threads=1",
    )
    train_run(recipe, out, callbacks=[Probe(out, signal_at)])


# SLURM's requeue ends the job: this scontrol stands in for it (there is no SLURM here)
SCONTROL = '#!/bin/bash\necho "$@" >> "$REQUEUE_LOG"\nkill -9 "$PPID"\n'


def _slurm_env(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "scontrol").write_text(SCONTROL)
    (bin_dir / "scontrol").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    env.update(
        PYTHONPATH=os.getcwd(),
        PATH=f"{bin_dir}:{env['PATH']}",
        REQUEUE_LOG=str(tmp_path / "requeued"),
        SLURM_NTASKS="1",
        SLURM_JOB_NAME="arm-a",
        SLURM_JOB_ID="4242",
        SLURM_PROCID="0",
        SLURM_LOCALID="0",
        SLURM_NODEID="0",
        OMP_NUM_THREADS="1",
    )
    return env


def _job(tmp_path, out, signal_at):
    """The job in its own process: SIGUSR1, then the requeue's ``kill -9`` of it."""
    return subprocess.run(
        [sys.executable, "-m", "tests.scaleout.test_requeue", str(out), str(signal_at)],
        env=_slurm_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_requeue_resumes_from_the_hpc_checkpoint_and_removes_it(tmp_path, monkeypatch):
    out = tmp_path / "run"
    first = _job(tmp_path, out, signal_at=SIGNAL_AT)
    assert first.returncode == -signal.SIGKILL, first.stderr[-2000:]  # killed by the requeue
    assert (tmp_path / "requeued").read_text().split() == ["requeue", "4242"]
    resume = out / "resume"
    hpc = [p.name for p in resume.iterdir() if HPC_NAME.match(p.name)]
    assert hpc == ["hpc_ckpt_1.ckpt"]
    assert load_resume_state(resume / "hpc_ckpt_1.ckpt")["global_step"] == SIGNAL_AT  # at the step boundary
    assert load_resume_state(resume / "last.ckpt")["global_step"] == 2
    assert resume_file(resume) == resume / "hpc_ckpt_1.ckpt"

    # the requeued attempt, in this process (no signal now: nothing ends it), in the job's environment
    for key in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(key)
    for key, value in _slurm_env(tmp_path).items():
        if os.environ.get(key) != value:
            monkeypatch.setenv(key, value)
    monkeypatch.delenv("WANDB_SERVICE", raising=False)
    run_job(str(out), signal_at=-1)
    assert (out / "started_at").read_text().split() == ["0", str(SIGNAL_AT)]  # from the HPC step, not from 2
    assert sorted(p.name for p in resume.iterdir() if p.suffix == ".ckpt") == ["last.ckpt"]  # superseded: gone
    assert load_resume_state(resume / "last.ckpt")["global_step"] == MAX_STEPS


def test_the_newest_state_wins_and_older_hpc_checkpoints_go(tmp_path):
    resume = tmp_path / "resume"
    resume.mkdir()
    assert resume_file(resume) is None
    for i, name in enumerate(("hpc_ckpt_1.ckpt", "last.ckpt", "hpc_ckpt_2.ckpt")):
        (resume / name).write_bytes(b"x")
        os.utime(resume / name, ns=(10**18 + i * 10**9,) * 2)
    assert resume_file(resume) == resume / "hpc_ckpt_2.ckpt"
    assert drop_superseded(resume, resume / "hpc_ckpt_2.ckpt") == [resume / "hpc_ckpt_1.ckpt"]
    os.utime(resume / "last.ckpt", ns=(10**18 + 5 * 10**9,) * 2)  # a later last.ckpt supersedes it
    assert resume_file(resume) == resume / "last.ckpt"
    drop_superseded(resume, resume / "last.ckpt")
    assert sorted(p.name for p in resume.iterdir()) == ["last.ckpt"]


if __name__ == "__main__":
    run_job(sys.argv[1], int(sys.argv[2]))
