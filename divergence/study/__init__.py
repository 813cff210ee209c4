"""The bounding study: the pair under study and its reference pairs, trained, then reported."""

from divergence.study.config import Study, StudyPair, load_study
from divergence.study.runner import PairFailed, PairJob, run_jobs

__all__ = ["PairFailed", "PairJob", "Study", "StudyPair", "load_study", "run_jobs"]
