"""Web apps publishing events: Flask (synchronous) and FastAPI (asynchronous)."""
