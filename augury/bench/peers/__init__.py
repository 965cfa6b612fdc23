"""Engines the harness measures side by side: augury in-process, llama.cpp, HF transformers."""
