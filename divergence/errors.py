"""Errors that mean "the user gave us something we cannot use".

The command line turns these into one line on stderr and exit code 2; every other
exception is a bug in divergence and keeps its traceback. They subclass ``ValueError``
so library callers can catch them with the built-in type.
"""


class UserInputError(ValueError):
    """Bad input: a missing or unreadable file, a bad option, mismatched models.

    The message names the file, key or tensor and says what to do about it.
    """


class CheckpointError(UserInputError):
    """A checkpoint cannot be read or matched against its partner."""


class RecipeError(UserInputError):
    """A recipe key is unknown, has the wrong type or an impossible value."""


class TrainingDiverged(UserInputError):
    """A run's loss became NaN or infinite without a loss scaler to absorb it.

    Raised after the step's records are written, so nothing measured is lost; the fix is
    in the recipe (a lower ``train.lr``, ``train.grad_clip``, or a loss-scaled precision).
    """
