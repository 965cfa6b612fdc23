"""Native CPU kernels (C++, built on first use with torch's extension builder).

torch's own CPU kernels leave two costs on a small model's decode step that no amount of Python
trimming removes: the int4 matmul dequantizes to floats for every row it multiplies (its cost grows
with rows, which is what a speculative verify window pays for), and few-query attention is a dozen
tiny ops per layer. The kernels here do that work in one call each. See `build.py` for how they are
compiled and when augury falls back to torch's kernels.
"""

from augury.cpu_kernels.build import available, load, unavailable_reason

__all__ = ["available", "load", "unavailable_reason"]
