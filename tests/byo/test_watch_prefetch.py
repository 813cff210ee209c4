"""``watch`` checks the next tracked step's files while it compares the current one: the same store."""

import shutil

from divergence.comparator.feeds import ArmFeed, Prefetch
from divergence.comparator.follow import Comparator
from divergence.pairfolder.folder import PairFolder
from divergence.pairfolder.arm.weights_file import identity, save_weights
from tests.byo.test_writer_options import train

import torch


def test_a_store_from_watch_with_prefetch_equals_one_without(tmp_path, monkeypatch):
    used = []
    checkpoint = Prefetch.checkpoint
    monkeypatch.setattr(
        Prefetch,
        "checkpoint",
        lambda self, arm, step: used.append((arm, step) in self._pending) or checkpoint(self, arm, step),
    )
    train(tmp_path / "with", "a", steps=8)
    train(tmp_path / "with", "b", steps=8, lr=0.1001)
    shutil.copytree(tmp_path / "with", tmp_path / "without")
    for folder, prefetch in (("with", True), ("without", False)):
        comparator = Comparator(tmp_path / folder, log=False, progress=False, prefetch=prefetch)
        assert comparator.run(poll=0.05, timeout=20) == 0
    stored = (tmp_path / "with" / "metrics.jsonl").read_bytes()
    assert stored == (tmp_path / "without" / "metrics.jsonl").read_bytes()
    assert stored.count(b'"tracked":true') == 9
    assert used.count(True) == 16  # steps 1..8 of both arms were checked ahead


def test_a_file_replaced_after_its_prefetch_is_checked_again(tmp_path):
    train(tmp_path, "a", steps=4)
    feeds = {"a": ArmFeed(tmp_path / "a")}
    prefetch = Prefetch(feeds, lambda step: True, max_steps=4)
    prefetch.after(2)  # checks step 3's file in the background
    path = PairFolder(tmp_path).arm("a").weights(3)
    prefetch._pending[("a", 3)].result()
    save_weights(path, {"weight": torch.ones(3, 4), "bias": torch.ones(3)}, step=3, arm="a", recipe={})  # replaced
    found = prefetch.checkpoint("a", 3)
    assert found is not None and tuple(found[1]) == identity(path)  # the new file's identity, not the old one's
    assert prefetch.checkpoint("a", 4) == feeds["a"].checkpoint(4)  # not prefetched: read now
    prefetch.close()
