"""A user's mistake found on the main process, raised on every process of the group.

Only global rank zero reads and writes an arm's records, so only it can find that a step's
weights hold other tensors, or that a folder refuses a writer. Raised there alone, the other
ranks would go on into the next collective (a DCP save, an all-reduce) and wait for rank zero
forever: a hang instead of one line. ``on_every_rank(check)`` runs ``check`` (which raises
``UserInputError`` on the main process only) and broadcasts its message from rank zero, so every
rank raises the same one line, or none does. Without a process group it is ``check()``.
"""

from __future__ import annotations

from divergence.errors import UserInputError


def on_every_rank(check):
    """``check()``'s result; its ``UserInputError`` raised on every rank of the default group."""
    import torch.distributed as dist

    result, error = None, None
    try:
        result = check()
    except UserInputError as err:
        error = str(err)
    if dist.is_available() and dist.is_initialized():
        box = [error]  # a str from our own rank zero: never a checkpoint's content
        dist.broadcast_object_list(box, src=0)
        error = box[0]
    if error is not None:
        raise UserInputError(error)
    return result
