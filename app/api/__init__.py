"""The HTTP layer: the app factory, FastAPI dependencies, routes per resource, middleware,
the OpenAPI customisation and the UI mount."""
