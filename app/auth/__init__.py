"""API keys (stored as SHA-256 hashes), roles and the FastAPI dependencies that enforce them."""
