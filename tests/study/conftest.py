"""The study tests' one trained study, shared by the modules that read it."""

import contextlib
import io
from types import SimpleNamespace

import pytest

from divergence.cli import main


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
    with contextlib.redirect_stdout(printed):
        code = main(["study", "--out", str(out), "--no-shared-arms", *TINY])
    return SimpleNamespace(out=out, code=code, printed=printed.getvalue())
