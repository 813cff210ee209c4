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


class ScriptError(UserInputError, SystemExit):
    """A ``UserInputError`` raised into a person's own training script (``ArmWriter``, the
    transformers and Lightning callbacks).

    Uncaught, it ends the script as ``sys.exit(message)`` does: one line on stderr
    (``divergence: error: ...``) and exit status 1, not a traceback through the training
    loop's and the Trainer's frames. Caught, it is the ``UserInputError`` (a ``ValueError``) it
    always was. Python prints a ``SystemExit`` whose ``code`` is a string and exits 1; an
    integer code would exit with it but print nothing, so the command line's status 2 is out of
    reach here.
    """

    def __init__(self, message: str):
        super().__init__(message)
        self.code = f"divergence: error: {message}"


def in_script(method):
    """``method`` with the ``UserInputError`` it raises raised again as a ``ScriptError``."""
    import functools

    @functools.wraps(method)
    def raise_in_script(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except ScriptError:
            raise
        except UserInputError as err:
            raise ScriptError(str(err)) from None

    return raise_in_script


def check_int(value, key: str, minimum: int, why: str = "", *, optional: bool = False):
    """``value`` when it is an integer (a bool is not) of at least ``minimum``, or None when
    ``optional``; else ``UserInputError("KEY=VALUE: must be an integer >= MINIMUM" + why)``."""
    if (value is None and optional) or (isinstance(value, int) and not isinstance(value, bool) and value >= minimum):
        return value
    raise UserInputError(f"{key}={value!r}: must be an integer >= {minimum}{why}")
