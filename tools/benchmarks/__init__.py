"""Benchmarks behind ``tools/bench``: one module per subcommand, listed in ``__main__``."""
