"""divergence: measure and bound how far a training optimization moves a model's weights.

The package follows the data flow of a study::

    recipe -> models and variants -> training (one arm or a pair)
           -> checkpoints and metrics store -> metrics -> loggers and report

``divergence.metrics`` holds the pure tensor functions everything else is built on.
"""

__version__ = "0.1.0"
