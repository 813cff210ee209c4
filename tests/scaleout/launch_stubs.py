"""Stand-ins for the commands launch's scripts call, so the scripts can run here end to end.

``sbatch``, ``srun``, ``scontrol``, ``torchrun`` and ``divergence`` each append one line to a
calls file, their name and then every argument in brackets (``srun [divergence] [train] ...``),
and ``sbatch`` prints a job id. A script that let a hostile value reach the shell unquoted would
run it: the tests put ``touch MARKER`` in such values and check that no marker appears.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

STUBS = ("sbatch", "srun", "scontrol", "torchrun", "divergence")
MARKER = "PWNED"
# Values that break out of a shell word, an #SBATCH line or a comment if pasted raw; each would
# create MARKER in the working directory if the shell ran it.
HOSTILE = (
    f"x$(touch {MARKER})",
    f"x`touch {MARKER}`",
    f"x;touch {MARKER}",
    f"x\ntouch {MARKER}",
    f"x'$(touch {MARKER})'",
    f'x"$(touch {MARKER})"',
    f"--x$(touch {MARKER})",
    "-x",
    "x y",
    "x#y",
    "x\\y",
    f"x&&touch {MARKER}",
    f"x|touch {MARKER}",
    f"x>{MARKER}",
    f"x\r\ntouch {MARKER}",
)


def install(folder: Path) -> dict:
    """The stubs under ``folder/bin``; the environment that puts them first on PATH (calls go to
    ``folder/calls``)."""
    bin_dir, calls = folder / "bin", folder / "calls"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in STUBS:
        path = bin_dir / name
        path.write_text(
            "#!/bin/bash\n{ printf '%s' \"${0##*/}\"; printf ' [%s]' \"$@\"; printf '\\n'; } >> "
            f"'{calls}'\n" + ('echo "4242;cluster"\n' if name == "sbatch" else "")
        )
        path.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242"}


def calls(folder: Path) -> str:
    path = folder / "calls"
    return path.read_text() if path.exists() else ""


def scripts(out: Path) -> list[Path]:
    """Every script launch wrote under ``out`` (a pair's ``launch/``, or a study's, pairs included)."""
    return sorted(p for p in out.rglob("launch/*") if p.suffix in (".sh", ".sbatch"))


def check_scripts(out: Path, env: dict, cwd: Path) -> None:
    """Each script parses (``bash -n``) and runs to its end with the stubs, in ``cwd``."""
    found = scripts(out)
    assert found, f"no scripts under {out}"
    for path in found:
        parsed = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert parsed.returncode == 0, f"{path}: {parsed.stderr}"
        ran = subprocess.run(["bash", str(path)], capture_output=True, text=True, env=env, cwd=cwd, timeout=60)
        assert ran.returncode == 0, f"{path}: exit {ran.returncode}: {ran.stderr[-2000:]}"
    for path in (p for p in found if p.suffix == ".sbatch"):  # the folders the submit scripts made
        line = next(x for x in path.read_text().splitlines() if x.startswith("#SBATCH --output="))
        log = Path(sbatch_filename(line.removeprefix("#SBATCH --output=")))
        assert log.parent.is_dir(), f"{path}: sbatch would write {log}, in a folder no script made"


def sbatch_filename(pattern: str, job_id: str = "4242") -> str:
    """What sbatch makes of an ``--output`` filename pattern (sbatch(1), "filename pattern"): ``%%`` is
    one ``%``; ``%j`` the job id, ``%x`` the job name, ``%A %a %J %N %n %s %t %u`` others, with an
    optional zero-padding width (``%5j``)."""
    values = {"j": job_id, "J": job_id, "A": job_id, "x": "job", "a": "0", "N": "node", "n": "0"}
    values |= {"s": "batch", "t": "0", "u": "user"}
    return re.sub(r"%(%|\d*[AaJjNnstux])", lambda m: "%" if m[1] == "%" else values[m[1][-1]], pattern)
