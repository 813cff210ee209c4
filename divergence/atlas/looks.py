"""Replicates in two looks: every row trains ``FIRST_REPLICATES`` first, and more only where they
leave it undecided and more would decide it.

A row's verdict has three readings, each with an interval over replicates and, while its
interval straddles the line it is read against, the replicates that would decide it
(``divergence.analysis.replicates.replicates_to_clear``, from the replicates' mean and spread):
the dose ratio against low precision (``inconclusive``), the ratio against the reordering
reference (``inconclusive``) and the outcome (``undecided``). A fourth reason a row is open: its
dose ratio has no interval because too few replicates formed a window (under 2 pooled: the
verdict is ``preliminary``; the fp32 reorderings of the DiT settle late, and in the CPU atlas 1 of 3
replicates of its ``data-parallel`` and ``tensor-parallel`` rows formed one). At the rate the first
look saw (w of k replicates), 2 windows form at about ceil(2 k / w) replicates: that is the count
that would decide it. After the first look a row trains
up to the study's replicates ``most`` only if one of them is undecided and would be decided within
``most``; the references then train ``most`` too (a row's ratios pair its replicate r with the
references' replicate r). A row the first look decides keeps its first-look interval; one whose
readings need more than ``most`` replicates (or no count within 1000) is not trained further: the
table says how many would decide it, as a single look at ``most`` replicates would have.

Why: most rows of the CPU atlas sit dex away from both lines (the fp32 reorderings 3-5 dex below
bf16, the low-precision rows 3-4 dex above the reordering reference), and 3 replicates decide them
(t_{0.975,2} = 4.30 and a spread of 0.1-0.3 dex: an interval of +/-0.25-0.75 dex), so training
every row 6 times spends most of the atlas's time on rows already decided. What the two looks
save, and how many rows the first look sent on, is measured in docs/measurements.md ("The CPU
atlas" and its AVX2 section).

What it costs the statistics: a status is now read at two replicate counts instead of one. Each
reading's 95% interval lies wholly on the wrong side of its line with probability at most 2.5%,
so a decided status is wrong with probability at most twice that of a single look (a union bound
over the two looks); ``--first-replicates`` equal to ``--replicates`` is the single look.
"""

from __future__ import annotations

FIRST_REPLICATES = 3  # the first look: 2 degrees of freedom, the fewest with a usable interval


def to_decide(verdict: dict | None, most: int) -> list[str]:
    """The readings of ``verdict`` (a ``summary.json`` verdict) that are undecided and would be
    decided within ``most`` replicates, as ``"<reading> <replicates>"``; [] when none is.

    >>> v = {"dose_ratio": {"status": "inconclusive", "replicates_needed": {"exclude_0": 5}},
    ...      "reordering": {"status": "inconclusive", "replicates_needed": 40}, "outcome": {"status": "within"}}
    >>> to_decide(v, 6), to_decide(v, 4)
    (['dose 5'], [])
    """
    if not verdict:
        return []
    dose = verdict.get("dose_ratio") or {}
    reordering = verdict.get("reordering") or {}
    outcome = verdict.get("outcome") or {}
    readings = (
        ("dose", dose.get("status") == "inconclusive", (dose.get("replicates_needed") or {}).get("exclude_0")),
        ("reordering", reordering.get("status") == "inconclusive", reordering.get("replicates_needed")),
        ("outcome", outcome.get("status") == "undecided", outcome.get("replicates_needed")),
        ("windows", *_windows(verdict)),
    )
    return [f"{name} {n}" for name, open_, n in readings if open_ and isinstance(n, int) and n <= most]


def _windows(verdict: dict) -> tuple[bool, int | None]:
    """Whether the dose ratio lacks an interval for want of windows (under 2 of the replicates
    trained formed one), and the replicates at which 2 would form at the rate seen (None for none
    formed: no rate to go by).

    >>> _windows({"dose_ratio": {"log10": -3.5, "lo": None, "replicates": 1}, "per_replicate": [{}, {}, {}]})
    (True, 6)
    >>> _windows({"dose_ratio": {"lo": -3.7, "replicates": 2}, "per_replicate": [{}, {}, {}]})
    (False, None)
    """
    dose = verdict.get("dose_ratio") or {}
    formed, trained = dose.get("replicates") or 0, len(verdict.get("per_replicate") or [])
    if dose.get("lo") is not None or formed >= min(2, trained):
        return False, None
    return True, (-(-2 * trained // formed) if formed else None)


def trained_prefix(done: set[tuple[str, int]], once: set[str], names: list[str], most: int) -> int:
    """How many replicates from 0 on every pair of ``names`` has finished (``done``: its finished
    ``(pair, replicate)``; a pair of ``once``, trained once like the control, needs replicate 0
    only), at most ``most``.

    >>> done = {("x", 0), ("x", 1), ("x", 3), ("ref", 0), ("ref", 1), ("ref", 2), ("ctl", 0)}
    >>> trained_prefix(done, {"ctl"}, ["x", "ref", "ctl"], 6)
    2
    """
    n = 0
    while n < most and all((name, 0 if name in once else n) in done for name in names):
        n += 1
    return n
