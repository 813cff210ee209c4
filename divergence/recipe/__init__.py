"""Recipes: YAML that names registered components and sets numbers, parsed and validated."""

from divergence.config.schema import apply_overrides, load_yaml, parse, require, to_dict

__all__ = ["apply_overrides", "load_yaml", "parse", "require", "to_dict"]
