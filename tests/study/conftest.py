"""The study tests' one trained study, shared by the modules that read it, and their studies' poll."""

import contextlib
import io
from types import SimpleNamespace

import pytest

from divergence.cli import main


# A study reads its children's progress, and starts the next pair run when one ends, once a second
# (``runner.POLL_SECONDS``; the pretraining bar every 2 s): a test's pair runs take seconds, so each start
# waited up to a second with a core idle. The same loop, polled every 0.2 s.
POLL_SECONDS = 0.2


def _quick_polls(patch) -> None:
    from divergence.study import pretrain, runner

    patch.setattr(runner, "POLL_SECONDS", POLL_SECONDS)
    patch.setattr(pretrain, "POLL_SECONDS", POLL_SECONDS)


@pytest.fixture(autouse=True)
def quick_polls(monkeypatch):
    """Every study a test here runs in its own process polls every ``POLL_SECONDS``."""
    _quick_polls(monkeypatch)


@pytest.fixture(scope="session")  # session: kept while its group runs, never rebuilt mid-run
def tiny_study(tmp_path_factory):
    """The default study, tiny (``test_study.TINY``: every pair on the DiT, the reordering at the others' batch
    of 2, 2 replicates of 4 steps, two pair runs side by side), trained pair by pair (``--no-shared-arms``)
    once for the tests that read it (on one xdist worker: tests/conftest.py): test_study's end to end, and
    test_shared_arms' pair-by-pair plan that the shared one must equal bit for bit. A study they run over it
    is refused or trains nothing (each test checks which); they never write into it."""
    from tests.study.test_study import TINY

    out = tmp_path_factory.mktemp("tiny-study") / "study"
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(printed):
        _quick_polls(patch)
        code = main(["study", "--out", str(out), "--no-shared-arms", *TINY])
    return SimpleNamespace(out=out, code=code, printed=printed.getvalue())
