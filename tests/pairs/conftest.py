from tests.training.tiny import one_torch_thread  # noqa: F401  (autouse: tiny models, one thread)
