"""The Dockerfile cannot be built here (no docker engine): check what can be checked without one."""

import fnmatch
import json
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INSTRUCTIONS = {
    "FROM",
    "ARG",
    "ENV",
    "RUN",
    "COPY",
    "ADD",
    "WORKDIR",
    "ENTRYPOINT",
    "CMD",
    "VOLUME",
    "LABEL",
    "EXPOSE",
    "USER",
    "SHELL",
    "HEALTHCHECK",
    "STOPSIGNAL",
    "ONBUILD",
}


def _instructions(path: Path) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per instruction: comments dropped, continuation lines joined."""
    text = re.sub(
        r"\\\n", " ", "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))
    )
    return [tuple(line.strip().split(None, 1)) for line in text.splitlines() if line.strip()]


def test_dockerfile_is_well_formed_and_copies_files_that_exist():
    steps = _instructions(ROOT / "docker/Dockerfile")
    keywords = [k for k, _ in steps]
    assert set(keywords) <= INSTRUCTIONS, set(keywords) - INSTRUCTIONS
    assert keywords.index("FROM") < keywords.index("RUN") and all(k in ("ARG", "FROM") for k in keywords[:2])
    base = dict(steps)["FROM"]
    image_arg = next(args for keyword, args in steps if keyword == "ARG" and args.startswith("CUDA_IMAGE="))
    assert base == "${CUDA_IMAGE}" and "nvidia/cuda:" in image_arg
    ignored = [p.strip() for p in (ROOT / ".dockerignore").read_text().splitlines() if p.strip() and p[0] != "#"]
    for keyword, args in steps:
        if keyword == "COPY":
            *sources, _ = args.split()
            for source in sources:
                assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
                assert not any(fnmatch.fnmatch(source, pattern) for pattern in ignored), f"{source} is dockerignored"
    assert json.loads(dict(steps)["ENTRYPOINT"]) == ["divergence"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert "divergence" in scripts  # what the entry point runs
    args = " ".join(a for k, a in steps if k == "ARG")
    assert "FLASH_ATTN=0" in args and "TORCH_INDEX_URL=" in args
    assert 'TORCH_CUDA_ARCH_LIST="8.0;9.0"' in " ".join(a for k, a in steps if k == "ENV")  # A100, H100


def test_docker_readme_covers_one_node_and_slurm():
    text = (ROOT / "docker/README.md").read_text()
    for needle in (
        "docker build -f docker/Dockerfile",
        "--gpus all",
        "enroot import",
        "--container-image",
        "apptainer",
        "divergence launch",
        "--scheduler slurm",
        "--scheduler torchrun",
    ):
        assert needle in text, needle
