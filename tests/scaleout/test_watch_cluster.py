"""The comparator on a cluster: it waits for arms that have not started, and it keeps disk bounded."""

import os
import shutil
import threading
import time

from divergence.cli import main



def test_watch_started_before_the_arms_waits_for_their_folder(arms, trained, tmp_path, capsys):
    later = tmp_path / "later"
    arms.rename(later)  # the folder does not exist when watch starts
    result = {}
    thread = threading.Thread(target=lambda: result.update(code=main(
        ["watch", str(arms), "--poll", "0.01", "--timeout", "30", "--quiet", "--no-log"])))
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
