"""Shared test set-up: quiet, offline, deterministic, CPU-only."""

import os

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
# A test that unsets WANDB_MODE to check the default must not find this machine's `wandb login`
# credentials and go online: no netrc unless a test makes one.
os.environ.setdefault("NETRC", os.path.join(os.path.dirname(__file__), "no-such-netrc"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("DIFFUSERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MPLBACKEND", "Agg")

import pytest  # noqa: E402  (after the environment above: nothing imported earlier reads it)


@pytest.fixture(scope="session")
def gloo_runs(tmp_path_factory):
    """Every 2-rank gloo run the tests read (``tests.gloo_runs``): one spawn of 2 processes a session."""
    from tests.gloo_runs import write_all

    return write_all(tmp_path_factory.mktemp("gloo"))


# The longest tests and shared fixtures' groups (pytest --durations on 2 busy cores), run first so that
# `-n 2` does not end on one of them while the other worker idles: nodeid prefixes, longest first.
LONG_FIRST = (
    "tests/study/test_study.py::test_tiny_study_end_to_end",  # group tiny_study
    "tests/scaleout/test_parallel_rows.py",  # 3 separate-job pairs on 2 gloo ranks
    "tests/scaleout/test_ddp_lockstep.py",  # group trained (tests/scaleout: with two_rank_runs, one torchrun)
    "tests/pairs/test_resume.py::test_resume_after_sigkill",
    "tests/study/test_calibrate.py::test_calibrate_trains_the_ladder",
    "tests/study/test_study_process.py",
    "tests/atlas/test_command.py::test_a_tiny_atlas_end_to_end",
    "tests/consequence/test_consequence.py",  # group chain: 4 pair runs trained, then scored again and again
    "tests/checkpoints/test_dcp.py",  # group gloo_runs
)
SHARED_SCOPES = ("session", "package", "module", "class")


def _shared_group(item) -> str | None:
    """The xdist group of a test using a module-, class- or session-scoped fixture of tests/: with
    ``--dist loadgroup`` its tests run on one worker, so the fixture is built once, not once per worker.
    An explicit ``xdist_group`` mark wins; of several fixtures, the widest scope's (then the first name)."""
    if item.get_closest_marker("xdist_group"):
        return None
    found = []
    for name in item.fixturenames:
        defs = item._fixtureinfo.name2fixturedefs.get(name)
        if not defs or defs[-1].scope not in SHARED_SCOPES:
            continue
        fixturedef = defs[-1]
        if not getattr(fixturedef.func, "__module__", "").startswith("tests"):
            continue  # pytest's own (tmp_path_factory, ...): nothing to share
        scope = SHARED_SCOPES.index(fixturedef.scope)
        owner = fixturedef.baseid if scope < 2 else item.nodeid.split("::")[0]
        if scope == 3 and item.cls is not None:
            owner = item.parent.nodeid
        found.append((scope, name, f"{owner}::{name}"))
    return min(found)[2] if found else None


@pytest.hookimpl(tryfirst=True)  # before xdist names the groups (its hook reads the marks)
def pytest_collection_modifyitems(config, items):
    units = {}
    for item in items:
        group = _shared_group(item)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
        mark = item.get_closest_marker("xdist_group")
        units[item.nodeid] = str(mark.args[0] if mark and mark.args else item.nodeid)

    def rank(item) -> int:
        return next((i for i, prefix in enumerate(LONG_FIRST) if item.nodeid.startswith(prefix)), len(LONG_FIRST))

    first = {}
    for item in items:
        unit = units[item.nodeid]
        first[unit] = min(first.get(unit, len(LONG_FIRST)), rank(item))
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (first[units[item.nodeid]], order[id(item)]))


class _GroupSuffix:
    """With ``--dist loadgroup`` xdist's scheduler reads a test's group from an ``@group`` suffix of its
    nodeid, which xdist 3.8 writes to ``item._nodeid``; pytest 9.2's nodeids are structured (``item._id``)
    and never read it, so every group was split over the workers and each shared fixture built once per
    worker (pytest-dev/pytest-xdist#1386). This writes the suffix where this pytest reads it."""

    @pytest.hookimpl(trylast=True)  # after xdist's own hook: acts only where its suffix did not take
    def pytest_collection_modifyitems(self, config, items):
        if not getattr(config.option, "loadgroup", False):  # set on xdist workers only
            return
        for item in items:
            marks = item.iter_markers("xdist_group")
            names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in marks})
            suffix = "@" + "_".join(names)
            if names and not item.nodeid.endswith(suffix) and hasattr(item, "_id"):
                from _pytest.nodeid import NodeId

                item._id = NodeId.parse(item.nodeid + suffix)


def pytest_configure(config):
    config.pluginmanager.register(_GroupSuffix(), "divergence-group-suffix")
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        _one_torch_thread()


def _one_torch_thread():
    """torch on one intra-op thread in each process that runs tests (an xdist worker, or pytest -n 0):
    two workers share two cores, and a second thread per worker only spins (tests/microbench's CLI
    fixture: 22.4 s of CPU on torch's default 2 threads, 8.6 s on 1). A hook, not an autouse fixture:
    a session fixture of tests/ would put every test in one xdist group (``_shared_group``). A test
    about threads sets them itself; processes a test starts get torch's default, as a user's do."""
    import torch

    torch.set_num_threads(1)
