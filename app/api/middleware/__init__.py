"""ASGI middleware: body size limit, admission control, rate limits, release timing."""
