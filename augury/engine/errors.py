"""Errors the engine raises to its callers (the server maps them to HTTP codes)."""


class EngineFull(RuntimeError):
    """The request queue is at --max-queue; retry later (HTTP 429)."""
