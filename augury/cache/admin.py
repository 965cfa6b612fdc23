"""`augury cache stats|clear` on a cache directory, without loading a model."""

from __future__ import annotations

import os
import shutil

from augury.cache.ssd_store import SUFFIX
from augury.cache.block_file import BlockFileError, read_header_file


def dir_stats(root: str) -> dict:
    """Files, bytes and namespaces by reading headers only; counts unreadable files."""
    files = nbytes = bad = 0
    namespaces: dict[str, int] = {}
    tokens = 0
    if os.path.isdir(root):
        for d in os.scandir(root):
            if not d.is_dir():
                continue
            for f in os.scandir(d.path):
                if not f.name.endswith(SUFFIX):
                    continue
                try:
                    hdr = read_header_file(f.path)
                except (BlockFileError, OSError):
                    bad += 1
                    continue
                files += 1
                nbytes += f.stat().st_size
                tokens += len(hdr.token_ids)
                namespaces[hdr.namespace] = namespaces.get(hdr.namespace, 0) + 1
    return {"dir": os.path.abspath(root), "files": files, "bytes": nbytes, "tokens": tokens,
            "namespaces": len(namespaces), "unreadable": bad}


def clear_dir(root: str) -> dict:
    """Delete every namespace directory of the cache (the root itself stays)."""
    removed = 0
    if os.path.isdir(root):
        for d in os.scandir(root):
            if d.is_dir():
                removed += sum(1 for f in os.scandir(d.path) if f.name.endswith(SUFFIX))
                shutil.rmtree(d.path, ignore_errors=True)
    return {"dir": os.path.abspath(root), "removed_files": removed}
