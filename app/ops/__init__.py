"""Operational endpoints (health, readiness) and HTTP helpers shared by the routers."""
