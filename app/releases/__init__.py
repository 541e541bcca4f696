"""Quantile queries: pricing, the locked release transaction, stored releases."""
