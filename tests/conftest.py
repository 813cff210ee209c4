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
