from divergence.cli import entry_point

entry_point()
