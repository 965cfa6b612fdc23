"""Sampling internals: pure logit processors. The public API is augury.engine.sampler."""
