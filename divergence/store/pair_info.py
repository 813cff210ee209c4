"""Moved to ``divergence.pairfolder.pair_json`` (the pair-folder contract); kept for old imports."""

from divergence.pairfolder.pair_json import CATEGORIES, FILENAME, PairInfo  # noqa: F401
