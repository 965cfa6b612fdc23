"""SSD tier: KV blocks as files, written by a background thread, LRU by bytes on disk.

Layout: `<root>/<namespace digest>/<chain hash hex>.<group>.akv` (format in
`block_file.py`). The engine thread only calls `put` (enqueue a CPU copy of the
rows: no disk I/O, never blocks) and, at admission, `get`. Start-up indexes the
directory by reading headers only. A block still waiting in the write queue is
served from its in-memory copy, so RAM eviction never opens a gap.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict, deque
from dataclasses import asdict, dataclass

import torch

from augury.cache.block_file import BlockFileError, encode_header, read_block_file, read_header_file, \
    write_block_file
from augury.cache.namespace import namespace_digest

log = logging.getLogger("augury.cache")

SUFFIX = ".akv"
_Key = tuple[str, str, str]  # (namespace digest, group, chain hash hex)


@dataclass
class SSDStats:
    files: int = 0
    bytes: int = 0
    max_bytes: int = 0
    pending_writes: int = 0
    pending_bytes: int = 0
    written: int = 0
    written_bytes: int = 0
    dropped: int = 0  # write-queue overflow (not persisted; persist-before-evict retries at eviction)
    evicted: int = 0  # deleted to stay under max_bytes
    hits: int = 0
    misses: int = 0
    corrupt: int = 0  # failed checksum/length/header: deleted, never served
    foreign: int = 0  # header names another namespace: deleted, never served
    write_errors: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class _Entry:
    path: str
    nbytes: int


@dataclass
class _Pending:
    key: _Key
    path: str
    namespace: str
    group: str
    chain_hash: bytes
    token_ids: tuple[int, ...]
    payload: torch.Tensor  # private CPU copy of the block's bytes
    layout: str
    nbytes: int


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class SSDStore:
    def __init__(self, root: str, max_bytes: int, max_pending_bytes: int = 512 * 1024**2, fsync: bool = True):
        if max_bytes <= 0:
            raise ValueError("ssd cache: max_bytes must be > 0")
        self.root = os.path.abspath(os.path.expanduser(root))
        os.makedirs(self.root, exist_ok=True)
        self.max_pending_bytes = max_pending_bytes
        self.fsync = fsync
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._index: OrderedDict[_Key, _Entry] = OrderedDict()  # oldest use first
        self._pending: dict[_Key, _Pending] = {}
        self._queue: deque[_Pending] = deque()
        self._busy = 0  # items taken off the queue, not yet indexed
        self._stop = False
        self.stats_ = SSDStats(max_bytes=max_bytes)
        self._scan()
        self._evict_locked()
        self._thread = threading.Thread(target=self._writer, name="augury-ssd-writer", daemon=True)
        self._thread.start()

    @property
    def max_bytes(self) -> int:
        return self.stats_.max_bytes

    # ---- start-up ------------------------------------------------------------
    def _scan(self) -> None:
        """Index every block file by its header; drop torn temp files of dead writers."""
        found: list[tuple[float, _Key, _Entry]] = []
        for d in os.scandir(self.root):
            if not d.is_dir():
                continue
            for f in os.scandir(d.path):
                name = f.name
                if ".tmp." in name:
                    pid = name.rsplit(".tmp.", 1)[1].split(".")[0]
                    if not pid.isdigit() or not _pid_alive(int(pid)) or int(pid) == os.getpid():
                        _unlink(f.path)
                    continue
                if not name.endswith(SUFFIX):
                    continue
                stem = name[: -len(SUFFIX)]
                try:
                    hexhash, group = stem.split(".", 1)
                    hdr = read_header_file(f.path)
                    if hdr.chain_hash != hexhash or hdr.group != group or \
                            namespace_digest(hdr.namespace) != d.name:
                        raise BlockFileError("header does not match the file name")
                    st = f.stat()
                except (BlockFileError, OSError, ValueError):
                    self.stats_.corrupt += 1
                    _unlink(f.path)
                    continue
                found.append((st.st_mtime, (d.name, group, hexhash), _Entry(f.path, st.st_size)))
        found.sort(key=lambda x: x[0])
        for _, key, e in found:
            self._index[key] = e
            self.stats_.bytes += e.nbytes
        self.stats_.files = len(self._index)

    # ---- engine-facing -------------------------------------------------------------
    def _key(self, namespace: str, group: str, chain_hash: bytes) -> tuple[_Key, str]:
        nd = namespace_digest(namespace)
        hx = chain_hash.hex()
        return (nd, group, hx), os.path.join(self.root, nd, f"{hx}.{group}{SUFFIX}")

    def contains(self, namespace: str, group: str, chain_hash: bytes) -> bool:
        key, _ = self._key(namespace, group, chain_hash)
        with self._lock:
            return key in self._index or key in self._pending

    def put(self, namespace: str, group: str, chain_hash: bytes, token_ids, payload: torch.Tensor,
            layout: str = "", force: bool = False) -> bool:
        """Queue one block for writing (`payload` must be a private CPU copy). Never blocks;
        returns False when already stored/queued or dropped because the queue is full
        (`force` — persist-before-evict — never drops)."""
        key, path = self._key(namespace, group, chain_hash)
        nbytes = payload.numel() * payload.element_size()
        with self._cond:
            if self._stop or key in self._index or key in self._pending:
                return False
            if not force and self.stats_.pending_bytes + nbytes > self.max_pending_bytes:
                self.stats_.dropped += 1
                return False
            item = _Pending(key, path, namespace, group, chain_hash, tuple(int(t) for t in token_ids),
                            payload, layout, nbytes)
            self._pending[key] = item
            self._queue.append(item)
            self.stats_.pending_writes += 1
            self.stats_.pending_bytes += nbytes
            self._cond.notify()
        return True

    def get(self, namespace: str, group: str, chain_hash: bytes, layout: str | None = None) -> torch.Tensor | None:
        """The block's payload, verified; None on a miss. A bad file (checksum, length, header,
        namespace or layout) is deleted and counted, never returned."""
        key, path = self._key(namespace, group, chain_hash)
        with self._lock:
            p = self._pending.get(key)
            if p is not None and (layout is None or p.layout == layout):
                self.stats_.hits += 1
                return p.payload
            e = self._index.get(key)
            if e is None:
                self.stats_.misses += 1
                return None
            self._index.move_to_end(key)
        try:
            _, t = read_block_file(e.path, namespace, layout)
        except FileNotFoundError:
            self._forget(key, count=None)
            return None
        except (BlockFileError, OSError) as err:
            self._forget(key, count="foreign" if "namespace" in str(err) else "corrupt")
            _unlink(e.path)
            log.warning("ssd cache: dropped %s (%s)", e.path, err)
            return None
        try:
            os.utime(e.path)  # recency survives a restart (start-up orders by mtime)
        except OSError:
            pass
        with self._lock:
            self.stats_.hits += 1
        return t

    def _forget(self, key: _Key, count: str | None) -> None:
        with self._lock:
            e = self._index.pop(key, None)
            if e is not None:
                self.stats_.bytes -= e.nbytes
                self.stats_.files = len(self._index)
            if count:
                setattr(self.stats_, count, getattr(self.stats_, count) + 1)
            else:
                self.stats_.misses += 1

    # ---- writer thread -------------------------------------------------------------------
    def _writer(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stop:
                    self._cond.wait()
                if not self._queue:
                    return
                item = self._queue.popleft()
                self._busy += 1
            n = 0
            try:
                os.makedirs(os.path.dirname(item.path), exist_ok=True)
                head, body = encode_header(item.namespace, item.group, item.chain_hash, item.token_ids,
                                           item.payload, item.layout)
                n = write_block_file(item.path, head, body, self.fsync)
            except Exception as e:  # disk full, permissions: the block just stays RAM-only
                log.warning("ssd cache: write of %s failed: %s", item.path, e)
                n = -1
            with self._cond:
                self._busy -= 1
                self._pending.pop(item.key, None)
                self.stats_.pending_writes -= 1
                self.stats_.pending_bytes -= item.nbytes
                if n < 0:
                    self.stats_.write_errors += 1
                else:
                    old = self._index.pop(item.key, None)
                    if old is not None:
                        self.stats_.bytes -= old.nbytes
                    self._index[item.key] = _Entry(item.path, n)
                    self.stats_.bytes += n
                    self.stats_.written += 1
                    self.stats_.written_bytes += n
                    self._evict_locked()
                self.stats_.files = len(self._index)
                self._cond.notify_all()

    def _evict_locked(self) -> None:
        while self.stats_.bytes > self.stats_.max_bytes and self._index:
            _, e = self._index.popitem(last=False)
            _unlink(e.path)
            self.stats_.bytes -= e.nbytes
            self.stats_.evicted += 1
        self.stats_.files = len(self._index)

    # ---- admin ------------------------------------------------------------------------
    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued block is on disk (or failed). False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._queue or self._busy:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def stats(self) -> SSDStats:
        with self._lock:
            return SSDStats(**asdict(self.stats_))

    def clear(self) -> int:
        """Delete every stored block (queued ones too); returns the number of files removed."""
        self.flush()
        with self._lock:
            n = len(self._index)
            for e in self._index.values():
                _unlink(e.path)
            self._index.clear()
            self.stats_.bytes = 0
            self.stats_.files = 0
        return n

    def close(self, flush: bool = True) -> None:
        if flush:
            self.flush()
        with self._cond:
            self._stop = True
            if not flush:
                for item in self._queue:
                    self._pending.pop(item.key, None)
                    self.stats_.pending_writes -= 1
                    self.stats_.pending_bytes -= item.nbytes
                self._queue.clear()
            self._cond.notify_all()
        self._thread.join(timeout=30)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
