"""Hooks into other libraries' trainers; each module imports its library only when used.

- ``divergence.integrations.transformers.ArmWriterCallback``: the transformers ``Trainer``.
"""
