from divergence.cli import entry_point

if __name__ == "__main__":  # not in a process spawned from this one (phase 2's scoring workers import it)
    entry_point()
