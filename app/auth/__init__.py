"""API keys (stored as SHA-256 hashes) and roles; the FastAPI dependencies live in app.api.deps."""
