"""dpquant: differentially private quantiles as a privacy-budgeted service."""

__version__ = "0.1.0"
