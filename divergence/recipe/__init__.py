"""Recipes: YAML that names registered components and sets numbers, parsed and validated."""
