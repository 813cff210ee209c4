"""Lightning's ranks 1..N-1 of a multi-rank arm, forked from the zygote that forked rank 0.

Lightning's ``_SubprocessScriptLauncher`` (DDP, FSDP, ``ModelParallelStrategy``: every strategy
``fit`` builds) starts each other rank as ``python -m divergence.__main__ ARGS`` with rank 0's
environment plus ``LOCAL_RANK``, ``NODE_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``.
A fresh interpreter spends ~9 s of CPU importing before it trains (``training.child_start``).
``ForkedRanks`` is that launcher with one line changed: the command goes to ``child_start.start``,
which forks it from the zygote when rank 0 is itself a forked child (a study's or an atlas's run,
a separate pair's arm job), and else starts the ``Popen`` Lightning would. Rank 0 never forks:
it has run torch and holds threads; the zygote, which has done neither, does. The rank variables
may differ from the zygote's (``child_start.JOB_ONLY``): no preloaded module reads them at import
but ``rank_zero_only.rank``, which the forked rank reads again from its own environment.

Lightning's process observer and its ``kill`` work on the forked ranks as on ``Popen`` ones
(``ForkedChild``: poll, send_signal, returncode), so a rank that fails still stops the job.
A Hydra run keeps Lightning's own launch (its command and cwd are Hydra's).
"""

from __future__ import annotations

import os

from lightning.pytorch.strategies.launchers.subprocess_script import (
    _HYDRA_AVAILABLE,
    _basic_subprocess_cmd,
    _SubprocessScriptLauncher,
)

from divergence.training import child_start


class ForkedRanks(_SubprocessScriptLauncher):
    """``_SubprocessScriptLauncher`` whose ranks are started by ``child_start.start``."""

    def _call_children_scripts(self) -> None:
        if _hydra_in_use():
            return super()._call_children_scripts()
        # Lightning 2.6's ``_call_children_scripts``, line for line, but for the marked line
        self._check_can_spawn_children()
        self.procs = []
        os.environ["MASTER_ADDR"] = self.cluster_environment.main_address
        os.environ["MASTER_PORT"] = str(self.cluster_environment.main_port)
        os.environ["NODE_RANK"] = str(self.cluster_environment.node_rank())
        os.environ["LOCAL_RANK"] = str(self.cluster_environment.local_rank())
        os.environ["WORLD_SIZE"] = f"{self.num_processes * self.num_nodes}"
        for local_rank in range(1, self.num_processes):
            env_copy = os.environ.copy()
            env_copy["LOCAL_RANK"] = f"{local_rank}"
            if os.environ.get("PL_GLOBAL_SEED") is None and "PL_GLOBAL_SEED" in env_copy:
                del env_copy["PL_GLOBAL_SEED"]
            # changed: subprocess.Popen(command, env=env_copy, cwd=None)
            self.procs.append(child_start.start(list(_basic_subprocess_cmd()), env_copy, new_zygote=False))
        return None


def fork_ranks(strategy) -> None:
    """Give ``strategy`` (a Trainer's, after its ``_configure_launcher``) ``ForkedRanks`` in place of
    Lightning's subprocess launcher; any other launcher (one process, spawn, SLURM's) is kept."""
    launcher = getattr(strategy, "_launcher", None)
    if type(launcher) is _SubprocessScriptLauncher:
        strategy._launcher = ForkedRanks(launcher.cluster_environment, launcher.num_processes, launcher.num_nodes)


def _hydra_in_use() -> bool:
    if not _HYDRA_AVAILABLE:
        return False
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.initialized()
