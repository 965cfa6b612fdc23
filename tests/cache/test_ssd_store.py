"""SSD store: file format checks, restart indexing, LRU by bytes, corruption, namespaces,
queue overflow, concurrent readers and writers."""

from __future__ import annotations

import os
import threading

import pytest
import torch

from augury.cache.block_file import BlockFileError, encode_header, read_block_file, read_header_file, \
    write_block_file
from augury.cache.ssd_store import SSDStore

NS = "model:tok:float32:native"


def payload(i: int, n: int = 256) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float32) + i


def h(i: int) -> bytes:
    return i.to_bytes(16, "little")


def files(root):
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs)


def test_block_file_round_trip_and_checks(tmp_path):
    p = str(tmp_path / "x.akv")
    head, body = encode_header(NS, "full", h(1), [1, 2, 3], payload(1), "lay")
    write_block_file(p, head, body)
    hdr = read_header_file(p)
    assert hdr.token_ids == (1, 2, 3) and hdr.layout == "lay" and hdr.shape == (256,)
    _, t = read_block_file(p, NS, "lay")
    assert torch.equal(t, payload(1))
    with pytest.raises(BlockFileError, match="namespace"):
        read_block_file(p, "other")
    with pytest.raises(BlockFileError, match="layout"):
        read_block_file(p, NS, "other")
    raw = open(p, "rb").read()
    open(p, "wb").write(raw[:-10])  # truncated
    with pytest.raises(BlockFileError):
        read_block_file(p, NS)
    flipped = bytearray(raw)
    flipped[-5] ^= 0xFF  # one payload bit
    open(p, "wb").write(bytes(flipped))
    with pytest.raises(BlockFileError, match="checksum"):
        read_block_file(p, NS)
    flipped = bytearray(raw)
    flipped[30] ^= 0x01  # header byte
    open(p, "wb").write(bytes(flipped))
    with pytest.raises(BlockFileError):
        read_header_file(p)


def test_write_flush_restart_get(tmp_path):
    s = SSDStore(str(tmp_path), 1 << 20)
    for i in range(5):
        assert s.put(NS, "full", h(i), [i] * 4, payload(i))
    assert not s.put(NS, "full", h(0), [0] * 4, payload(0))  # already queued/stored
    assert s.flush(10)
    st = s.stats()
    assert st.files == 5 and st.written == 5 and st.pending_writes == 0 and st.bytes == sum(
        os.path.getsize(f) for f in files(tmp_path))
    s.close()
    s2 = SSDStore(str(tmp_path), 1 << 20)  # restart: index from headers
    assert s2.stats().files == 5
    for i in range(5):
        assert torch.equal(s2.get(NS, "full", h(i)), payload(i))
    assert s2.get(NS, "full", h(9)) is None and s2.get("other-ns", "full", h(0)) is None
    assert s2.get(NS, "sliding", h(0)) is None
    s2.close()


def test_lru_by_bytes_on_disk(tmp_path):
    one = None
    s = SSDStore(str(tmp_path), 1 << 30)
    s.put(NS, "full", h(0), [0], payload(0))
    s.flush()
    one = s.stats().bytes
    s.close()
    s = SSDStore(str(tmp_path), 3 * one)  # room for three blocks
    for i in range(1, 3):
        s.put(NS, "full", h(i), [i], payload(i))
        s.flush()
    assert s.get(NS, "full", h(0)) is not None  # 0 becomes most recently used
    s.put(NS, "full", h(3), [3], payload(3))
    s.flush()
    st = s.stats()
    assert st.files == 3 and st.bytes <= 3 * one and st.evicted == 1
    assert s.get(NS, "full", h(1)) is None  # the least recently used went first
    assert all(s.get(NS, "full", h(i)) is not None for i in (0, 2, 3))
    assert len(files(tmp_path)) == 3
    s.close()


def test_corrupted_and_truncated_files_are_deleted_and_counted(tmp_path):
    s = SSDStore(str(tmp_path), 1 << 20)
    for i in range(3):
        s.put(NS, "full", h(i), [i], payload(i))
    s.close()
    f0, f1, f2 = files(tmp_path)
    raw = open(f0, "rb").read()
    open(f0, "wb").write(raw[:-1] + bytes([raw[-1] ^ 1]))  # payload bit flip: header intact
    open(f1, "wb").write(raw[:20])  # torn header
    s = SSDStore(str(tmp_path), 1 << 20)
    assert s.stats().corrupt == 1 and not os.path.exists(f1)  # caught at start-up (header)
    got = [s.get(NS, "full", h(i)) for i in range(3)]
    assert sum(g is not None for g in got) == 1  # f2 only
    assert s.stats().corrupt == 2 and not os.path.exists(f0)
    s.close()


def test_foreign_namespace_is_never_served(tmp_path):
    s = SSDStore(str(tmp_path), 1 << 20)
    s.put("ns-a", "full", h(1), [1], payload(1))
    s.put("ns-b", "full", h(1), [1], payload(2))  # same chain hash, other namespace
    s.flush()
    assert torch.equal(s.get("ns-a", "full", h(1)), payload(1))
    assert torch.equal(s.get("ns-b", "full", h(1)), payload(2))
    s.close()
    # a file copied into another namespace's directory is refused by its header
    fa = [f for f in files(tmp_path)]
    da, db = sorted({os.path.dirname(f) for f in fa})
    src = next(f for f in fa if f.startswith(da))
    dst = os.path.join(db, os.path.basename(src))
    os.replace(src, dst)  # ns-a's bytes now sit where ns-b's block was
    s = SSDStore(str(tmp_path), 1 << 20)
    assert s.get("ns-b", "full", h(1)) is None and s.get("ns-a", "full", h(1)) is None
    assert s.stats().corrupt == 1 and s.stats().files == 0
    s.close()


def test_pending_blocks_are_served_and_overflow_is_dropped_unless_forced(tmp_path):
    s = SSDStore(str(tmp_path), 1 << 30, max_pending_bytes=1)  # every unforced put overflows
    assert not s.put(NS, "full", h(1), [1], payload(1))
    assert s.stats().dropped == 1
    assert s.put(NS, "full", h(1), [1], payload(1), force=True)
    assert torch.equal(s.get(NS, "full", h(1)), payload(1))  # queued or written: served either way
    s.flush()
    assert s.stats().written == 1
    s.close()


def test_clear_and_tmp_leftovers(tmp_path):
    s = SSDStore(str(tmp_path), 1 << 20)
    s.put(NS, "full", h(1), [1], payload(1))
    s.flush()
    d = os.path.dirname(files(tmp_path)[0])
    open(os.path.join(d, "abc.full.akv.tmp.999999999.0000"), "wb").write(b"torn")
    s.close()
    s = SSDStore(str(tmp_path), 1 << 20)  # the dead writer's temp file goes
    assert [os.path.basename(f) for f in files(tmp_path)] == [os.path.basename(f) for f in files(tmp_path)
                                                                if f.endswith(".akv")]
    assert s.clear() == 1 and s.stats().files == 0 and files(tmp_path) == []
    s.close()


def test_concurrent_readers_and_writers(tmp_path):
    s = SSDStore(str(tmp_path), 40 * 1100, max_pending_bytes=1 << 30)  # ~40 files: eviction runs too
    errors: list[str] = []

    def writer(base: int):
        for i in range(base, base + 100):
            s.put(NS, "full", h(i), [i], payload(i))

    def reader():
        for _ in range(3):
            for i in range(400):
                t = s.get(NS, "full", h(i))
                if t is not None and not torch.equal(t, payload(i)):
                    errors.append(f"block {i} served wrong bytes")

    ts = [threading.Thread(target=writer, args=(100 * k,)) for k in range(4)]
    ts += [threading.Thread(target=reader) for _ in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert s.flush(30)
    st = s.stats()
    assert not errors and st.corrupt == 0 and st.write_errors == 0
    assert st.bytes <= st.max_bytes and st.files == len(files(tmp_path))
    s.close()
