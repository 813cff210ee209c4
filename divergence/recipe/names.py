"""Names that become file names, shell words and job names: one rule where they enter, one slug
for names we did not choose.

A name of ours (a pair's, a study's, a calibration's, the wandb group given to ``launch``) names
folders (``OUT/<pair>/r0``), SLURM jobs (``#SBATCH --job-name=<study>-<pair>-r0-arm-a``) and words
of the scripts ``launch`` writes, so it is held to one rule where it enters (a recipe's ``name:``,
an override ``name=...``, a flag): 1 to 100 letters, digits, ``.``, ``_`` or ``-``, the first a
letter or digit. Nothing in it is special to bash, to ``sbatch`` or to a path: no ``$`` or
backquote, no quote, no separator or newline, never ``..`` or a leading ``-`` read as an option.

Names read from folders that other tools wrote (a ``pair.json``'s name) follow no rule;
``file_stem`` turns one into a file name that no other name shares.
"""

from __future__ import annotations

import hashlib
import re

from divergence.errors import RecipeError
from divergence.config.yaml_safe import short

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
RULE = "1-100 letters, digits, '.', '_' or '-', starting with a letter or digit"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def check_name(value, key: str, what: str = "name", names: str = "a folder") -> str:
    """``value`` if it follows the rule, else a one-line ``RecipeError`` naming ``key`` and the value.

    >>> check_name("flash-vs-baseline", "name")
    'flash-vs-baseline'
    """
    if not isinstance(value, str) or not NAME.fullmatch(value):
        raise RecipeError(f"{key}: {short(value)} is not a usable {what}; use {RULE} (it names {names})")
    return value


def file_stem(name: str) -> str:
    """A file-name part for ``name`` that no other name shares: its characters outside
    ``[A-Za-z0-9_.-]`` replaced by ``_``, then ``-`` and the first 8 hex digits of the SHA-256
    of the exact name, so ``flash x`` and ``flash_x`` (one slug) still get two files.

    >>> file_stem("flash x"), file_stem("flash_x")
    ('flash_x-6f6c0370', 'flash_x-82ea50a2')
    """
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{_UNSAFE.sub('_', name)[:80]}-{digest}"
