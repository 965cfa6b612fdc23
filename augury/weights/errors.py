"""Errors raised while locating or loading model weights; messages name the fix."""

from __future__ import annotations


class WeightsError(ValueError):
    """A checkpoint is malformed or uses something augury cannot load."""


class ModelNotFoundError(FileNotFoundError):
    """A model name or path does not resolve to weights on this machine."""
