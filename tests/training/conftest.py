"""Tiny-model tests run on one torch thread."""

import pytest

from tests.training.tiny import one_torch_thread  # noqa: F401  (autouse fixture)


@pytest.fixture(scope="session")
def zygote_root(tmp_path_factory):
    """The folder of the zygote the fork tests share (``tests.training.forks``), closed at the end."""
    from divergence.training import child_start
    from tests.training.forks import write_site

    root = tmp_path_factory.mktemp("zygote")
    write_site(root)
    yield root
    child_start.close_all()
