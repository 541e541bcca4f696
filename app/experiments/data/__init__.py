"""Data files shipped with the experiments (read through importlib.resources)."""
