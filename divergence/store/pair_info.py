"""``DIR/pair.json``: what a paired run compared, so a report can read it without the trainer.

Written when a pair run starts (``finished: false``) and rewritten atomically when it ends.
Keys (a contract between training and the report):

- ``name``: the pair's name (``flash-vs-baseline``);
- ``category``: what the two arms differ in, which decides its role in a bounding study:
  ``control`` (nothing), ``seed`` (weight-init seed only), ``precision`` (training precision
  only), ``optimization`` (anything else: the pair under study);
- ``arms``: ``{"a": [variant, ...], "b": [...]}``, each variant a short string
  (``attention=sdpa-flash``);
- ``description``: one line a person reads (``sdpa-flash vs baseline attention``);
- ``max_steps``, ``finished`` (bool), ``last_step`` (int or null);
- ``recipe``: the resolved base recipe as plain data (arm a's, with its replicate's seeds);
- ``replicate``: which replicate of the pair this run is (int, 0 when absent: runs made before
  replicates existed). Replicate r of every pair of a study shares its initial weights, batches
  and probe set; (``name``, ``replicate``) is unique among a study's runs;
- ``tracking``: the pair's tracking schedule as plain data (``every``, ``dense`` as
  ``[[until, every], ...]``, ``probe`` ``{enabled, size, seed, batch_size}``, ...); ``{}`` when
  absent.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from divergence.errors import UserInputError
from divergence.tables import write_json

FILENAME = "pair.json"
CATEGORIES = ("optimization", "seed", "precision", "control")


@dataclass
class PairInfo:
    name: str
    category: str
    arms: dict[str, list[str]]
    description: str = ""
    max_steps: int = 0
    finished: bool = False
    last_step: int | None = None
    recipe: dict = field(default_factory=dict)
    replicate: int = 0
    tracking: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.category not in CATEGORIES:
            raise ValueError(f"pair category {self.category!r} is not one of {', '.join(CATEGORIES)}")

    def write(self, folder: str | Path) -> None:
        write_json(Path(folder) / FILENAME, asdict(self))

    @classmethod
    def read(cls, folder: str | Path) -> "PairInfo":
        path = Path(folder) / FILENAME
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise UserInputError(f"{path}: not found; is {folder} a paired-training run folder?") from None
        except (OSError, ValueError) as err:
            raise UserInputError(f"{path}: unreadable ({err})") from None
        try:
            return cls(**{k: data[k] for k in data if k in cls.__dataclass_fields__})
        except (TypeError, ValueError) as err:
            raise UserInputError(f"{path}: {err}") from None
