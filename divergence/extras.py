"""Optional dependencies: which ``pip install 'divergence[EXTRA]'`` a command needs, said in one line.

``pip install divergence`` (torch, numpy, safetensors, tqdm, pyyaml) is enough for ``compare``,
``export`` to CSV, ``store``, ``watch --no-wandb`` and the Python metrics. The rest comes in extras
(``pyproject.toml``)::

    train        lightning, diffusers, transformers, pillow   train, study, calibrate, microbench
    wandb        wandb, wandb-workspaces                        wandb logs, dashboard, artifacts
    report       matplotlib, scipy                              report, study's analysis
    parquet      pyarrow                                        export --parquet
    tensorboard  tensorboard                                    log.tensorboard
    fp8, int8    torchao                                        the fp8 and int8-mixed variants
    all          every extra above

A command calls ``require(extra, module, ...)`` before it imports them; the CLI turns a
``MissingExtra`` (a ``UserInputError``) into one line and exit code 2, and does the same for an
``ImportError`` of a module listed here that a command did not check for first.
"""

from __future__ import annotations

import importlib.util

from divergence.errors import UserInputError

# import name -> (extra, the package pip installs)
MODULES = {
    "lightning": ("train", "lightning"),
    "diffusers": ("train", "diffusers"),
    "transformers": ("train", "transformers"),
    "PIL": ("train", "pillow"),
    "wandb": ("wandb", "wandb"),
    "wandb_workspaces": ("wandb", "wandb-workspaces"),
    "matplotlib": ("report", "matplotlib"),
    "scipy": ("report", "scipy"),
    "pyarrow": ("parquet", "pyarrow"),
    "tensorboard": ("tensorboard", "tensorboard"),
    "torchao": ("fp8", "torchao"),  # the int8 extra installs it too
}


class MissingExtra(UserInputError):
    """A command needs a package of an extra that is not installed."""


def installed(module: str) -> bool:
    """Whether ``module`` can be imported (found on the path; not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent that fails to import; a module set to None
        return False


def hint(module: str, extra: str | None = None) -> str:
    """``needs lightning, from the 'train' extra: pip install 'divergence[train]'``."""
    extra = extra or MODULES.get(module.split(".")[0], ("all", module))[0]
    package = MODULES.get(module.split(".")[0], (extra, module))[1]
    return f"needs {package} (not installed), from the '{extra}' extra: pip install 'divergence[{extra}]'"


def require(extra: str, *modules: str) -> None:
    """Raise ``MissingExtra`` naming ``extra`` unless every one of ``modules`` is installed."""
    for module in modules:
        if not installed(module):
            raise MissingExtra(hint(module, extra))


def missing_extra(err: ImportError) -> MissingExtra | None:
    """The ``MissingExtra`` an ``ImportError`` of an optional package means, None for any other."""
    name = getattr(err, "name", None) or ""
    top = name.split(".")[0]
    if top not in MODULES or installed(top):
        return None
    return MissingExtra(hint(top))
