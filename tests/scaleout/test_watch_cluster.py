"""The comparator on a cluster: it waits for arms that have not started, and it keeps disk bounded."""

import os

import pytest
import threading
import time

from divergence.cli import main


def test_watch_started_before_the_arms_waits_for_their_folder(arms, trained, tmp_path, capsys):
    later = tmp_path / "later"
    arms.rename(later)  # the folder does not exist when watch starts
    result = {}
    thread = threading.Thread(
        target=lambda: result.update(
            code=main(["watch", str(arms), "--poll", "0.01", "--timeout", "30", "--quiet", "--no-wandb"])
        )
    )
    thread.start()
    time.sleep(0.5)
    assert thread.is_alive()  # waiting, not failed
    later.rename(arms)  # the arms' first job creates it
    thread.join(60)
    assert result == {"code": 0}
    assert (arms / "metrics.jsonl").read_bytes() == (trained / "lockstep/metrics.jsonl").read_bytes()
    assert "waiting for" in capsys.readouterr().err


def test_watch_on_a_folder_that_never_appears_times_out(tmp_path, capsys):
    start = time.monotonic()
    assert main(["watch", str(tmp_path / "nowhere"), "--poll", "0.01", "--timeout", "0.3"]) == 1
    assert time.monotonic() - start < 5
    err = capsys.readouterr().err
    assert "timed out" in err and "nowhere" in err, err


def _set_keep(out, keep):
    """``tracking.keep`` in the pair files the arms wrote (as ``train --arm ... tracking.keep=K`` would)."""
    import json

    import yaml

    config = yaml.safe_load((out / "pair.yaml").read_text())
    config["tracking"]["keep"] = keep
    (out / "pair.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    info = json.loads((out / "pair.json").read_text())
    info.setdefault("tracking", {})["keep"] = keep
    (out / "pair.json").write_text(json.dumps(info))


def _weights(out):
    return {arm: sorted(p.name for p in (out / arm / "checkpoints").iterdir()) for arm in "ab"}


def _name(step):
    return f"step_{step:06d}.safetensors"


def test_keep_deletes_only_compared_steps_keeping_every_kth_and_the_last(arms, trained):
    from divergence.comparator.follow import Comparator
    from divergence.training.probe_files import FileProbe
    from divergence.comparator.retention import Retention

    # tracked steps 0, 2, 3, 4: keep 2 keeps the 0th and 2nd (steps 0, 3) and the last (4)
    _set_keep(arms, 2)
    seen = []
    original = Retention.release

    def release(self, step):  # at each release, nothing of a later step is gone yet
        removed = original(self, step)
        seen.append((step, removed, _weights(arms)))
        return removed

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Retention, "release", release)
        assert Comparator(arms, log=False, progress=False, probe=FileProbe).run(poll=0.01, timeout=30) == 0
    assert _weights(arms) == {arm: [_name(0), _name(3), _name(4)] for arm in "ab"}
    assert [(s, sorted(p.name for p in r)) for s, r, _ in seen if r] == [(2, [_name(2), _name(2)])]
    for step, _, files in seen:
        assert all(_name(s) in files[arm] for arm in "ab" for s in (0, 2, 3, 4) if s > step)
    assert (arms / "metrics.jsonl").read_bytes() == (trained / "lockstep/metrics.jsonl").read_bytes()
    assert not (arms / "retention.json").exists()


def test_keep_null_keeps_everything(arms):
    from divergence.comparator.follow import Comparator
    from divergence.training.probe_files import FileProbe

    before = _weights(arms)
    assert Comparator(arms, log=False, progress=False, probe=FileProbe).run(poll=0.01, timeout=30) == 0
    assert _weights(arms) == before


class Killed(Exception):
    pass


def test_a_comparator_killed_between_compare_and_delete_loses_nothing(arms, trained, monkeypatch):
    from divergence.comparator.follow import Comparator
    from divergence.training.probe_files import FileProbe
    from divergence.comparator.retention import Retention
    from divergence.store import MetricsStore

    _set_keep(arms, 2)
    original_append = MetricsStore.append_step

    def killed_before_commit(self, step, *args):
        if step == 2:
            raise Killed  # compared and noted, not committed: nothing may be deleted
        original_append(self, step, *args)

    monkeypatch.setattr(MetricsStore, "append_step", killed_before_commit)
    with pytest.raises(Killed):
        Comparator(arms, log=False, progress=False, probe=FileProbe).run(poll=0.01, timeout=30)
    assert (arms / "retention.json").exists()
    assert _name(2) in _weights(arms)["a"] and _name(2) in _weights(arms)["b"]

    monkeypatch.setattr(MetricsStore, "append_step", original_append)
    monkeypatch.setattr(Retention, "release", lambda self, step: (_ for _ in ()).throw(Killed()))
    with pytest.raises(Killed):  # committed step 2, killed before deleting its files
        Comparator(arms, log=False, progress=False, probe=FileProbe).run(poll=0.01, timeout=30)
    assert _name(2) in _weights(arms)["a"]
    assert max(MetricsStore(arms).steps()) == 2

    monkeypatch.undo()
    assert Comparator(arms, log=False, progress=False, probe=FileProbe).run(poll=0.01, timeout=30) == 0  # restarted
    assert _weights(arms) == {arm: [_name(0), _name(3), _name(4)] for arm in "ab"}
    assert (arms / "metrics.jsonl").read_bytes() == (trained / "lockstep/metrics.jsonl").read_bytes()


def test_retention_schedule_and_a_rewritten_file_stays(tmp_path):
    from divergence.comparator.retention import Retention

    r = Retention(tmp_path, 3, [0, 1, 2, 3, 4, 5, 6, 10, 20])
    assert [s for s in (0, 1, 2, 3, 4, 5, 6, 10, 20) if r.kept(s)] == [0, 3, 6, 20]
    assert all(Retention(tmp_path, k, [0, 5, 10]).kept(5) for k in (0, None))
    path = tmp_path / "a" / "checkpoints" / _name(5)  # arm a's weights of step 5: all a note may name
    path.parent.mkdir(parents=True)
    path.write_bytes(b"compared")
    from divergence.pairfolder.arm.weights_file import identity

    Retention(tmp_path, 2, [0, 5, 10]).note(5, {"a": path}, {"a": identity(path)})
    os.replace(_rewrite(path.parent), path)  # an arm restarted and wrote the step again
    Retention(tmp_path, 2, [0, 5, 10]).recover(5)  # deletes nothing itself
    assert path.read_bytes() == b"rewritten"
    assert not (tmp_path / "retention.json").exists()


def _rewrite(folder):
    new = folder / "new"
    new.write_bytes(b"rewritten")
    return new
