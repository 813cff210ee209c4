"""Typed configuration from YAML: the hardened loader every YAML read goes through (``yaml_safe``)
and the dataclass parser with its one-line errors (``schema``).

The lowest layer of the package above ``errors``: recipes (``divergence.recipe``), the pair
folder's recorded schedule (``divergence.pairfolder``) and studies parse with it; it imports
nothing of theirs.
"""
