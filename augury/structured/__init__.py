"""Structured (grammar-constrained) output: per-request matchers over xgrammar."""

from augury.structured.matcher import GrammarBackend, GrammarMatcher, make_matcher

__all__ = ["GrammarBackend", "GrammarMatcher", "make_matcher"]
