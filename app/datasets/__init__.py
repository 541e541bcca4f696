"""Datasets: public bounds and grid, the stored values, upload and freezing."""
