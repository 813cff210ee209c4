"""Moved to ``divergence.pairfolder.weights_file`` (the pair-folder contract); kept for old imports."""

from divergence.pairfolder.weights_file import (  # noqa: F401
    FORMAT, completed, identity, read_metadata, save_weights, weights_path,
)
