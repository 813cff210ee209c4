"""The bounding study: the pair under study and its reference pairs, trained, then reported."""

from divergence.study.config import Study, StudyPair, load_study
from divergence.study.runner import PairFailed, PairJob, prepare_jobs, run_jobs

__all__ = ["PairFailed", "PairJob", "Study", "StudyPair", "load_study", "prepare_jobs", "run_jobs"]
