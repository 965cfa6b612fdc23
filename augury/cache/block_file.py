"""On-disk format of one cached KV block (one group's rows for one chained hash).

    offset  size  field
    0       8     magic b"AUGKVBLK"
    8       4     format version (u32 LE)
    12      4     header length H (u32 LE)
    16      4     CRC32 of the header bytes (u32 LE)
    20      H     header: UTF-8 JSON (namespace, group, chain hash, token ids, dtype, shape,
                  layout, payload length, payload CRC32)
    20+H    P     payload: the block's rows, C-contiguous

`layout` names how the payload maps onto the pool (layers, K/V, codec parts
with their dtypes and shapes); a reader only accepts its own layout.

The header is enough to index a file at start-up; the payload CRC is checked
on every read, so a torn or corrupted file is never served. CRC32 (not a
cryptographic hash) is enough: it guards against crashes and bit rot, and the
namespace check guards against serving another model's bytes.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from dataclasses import dataclass

import torch

MAGIC = b"AUGKVBLK"
FORMAT_VERSION = 1
_PRELUDE = struct.Struct("<8sIII")  # magic, version, header length, header crc
MAX_HEADER = 1 << 20

_DTYPES = {str(d).removeprefix("torch."): d for d in
           (torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.float64, torch.int32)}


class BlockFileError(ValueError):
    """A block file is truncated, corrupted, of another version or another namespace."""


@dataclass(frozen=True)
class BlockHeader:
    namespace: str
    group: str
    chain_hash: str  # hex of the chained block hash
    token_ids: tuple[int, ...]
    dtype: str
    shape: tuple[int, ...]
    layout: str
    payload_len: int
    payload_crc: int

    def to_json(self) -> bytes:
        d = dict(self.__dict__, token_ids=list(self.token_ids), shape=list(self.shape))
        return json.dumps(d, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> "BlockHeader":
        d = json.loads(raw)
        return cls(namespace=d["namespace"], group=d["group"], chain_hash=d["chain_hash"],
                   token_ids=tuple(d["token_ids"]), dtype=d["dtype"], shape=tuple(d["shape"]),
                   layout=d["layout"], payload_len=int(d["payload_len"]), payload_crc=int(d["payload_crc"]))

    @property
    def file_len(self) -> int:
        return _PRELUDE.size + len(self.to_json()) + self.payload_len


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """Raw bytes of a CPU tensor without a copy (any dtype, bf16 included)."""
    flat = t.contiguous().reshape(-1).view(torch.uint8)
    return memoryview(flat.numpy()).cast("B")


def encode_header(namespace: str, group: str, chain_hash: bytes, token_ids: list[int] | tuple[int, ...],
                  payload: torch.Tensor, layout: str = "") -> tuple[bytes, memoryview]:
    """(prelude + header bytes, payload bytes) for a CPU `payload` tensor."""
    body = tensor_bytes(payload)
    hdr = BlockHeader(namespace, group, chain_hash.hex(), tuple(int(t) for t in token_ids),
                      str(payload.dtype).removeprefix("torch."), tuple(payload.shape), layout, body.nbytes,
                      zlib.crc32(body))
    raw = hdr.to_json()
    return _PRELUDE.pack(MAGIC, FORMAT_VERSION, len(raw), zlib.crc32(raw)) + raw, body


def write_block_file(path: str, prelude_and_header: bytes, payload: memoryview, fsync: bool = True) -> int:
    """Write to a temporary name, fsync, then rename over `path` (atomic on POSIX).
    A crash at any point leaves either no file at `path` or a complete one."""
    tmp = f"{path}.tmp.{os.getpid()}.{os.urandom(4).hex()}"
    try:
        with open(tmp, "wb") as f:
            f.write(prelude_and_header)
            f.write(payload)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return len(prelude_and_header) + payload.nbytes


def read_header(f) -> tuple[BlockHeader, int]:
    """Header of an open block file and the payload's offset; raises BlockFileError."""
    pre = f.read(_PRELUDE.size)
    if len(pre) != _PRELUDE.size:
        raise BlockFileError("truncated prelude")
    magic, version, hlen, hcrc = _PRELUDE.unpack(pre)
    if magic != MAGIC:
        raise BlockFileError("not a block file")
    if version != FORMAT_VERSION:
        raise BlockFileError(f"format version {version}, expected {FORMAT_VERSION}")
    if hlen > MAX_HEADER:
        raise BlockFileError("header too long")
    raw = f.read(hlen)
    if len(raw) != hlen or zlib.crc32(raw) != hcrc:
        raise BlockFileError("header checksum mismatch")
    try:
        return BlockHeader.from_json(raw), _PRELUDE.size + hlen
    except (ValueError, KeyError, TypeError) as e:
        raise BlockFileError(f"bad header: {e}") from None


def read_header_file(path: str) -> BlockHeader:
    with open(path, "rb") as f:
        hdr, off = read_header(f)
        size = os.fstat(f.fileno()).st_size
    if size != off + hdr.payload_len:
        raise BlockFileError(f"file is {size} bytes, header says {off + hdr.payload_len}")
    return hdr


def read_block_file(path: str, namespace: str, layout: str | None = None) -> tuple[BlockHeader, torch.Tensor]:
    """Header and payload tensor; verifies namespace, layout, length and CRC."""
    with open(path, "rb") as f:
        hdr, _ = read_header(f)
        if hdr.namespace != namespace:
            raise BlockFileError("namespace mismatch")
        if layout is not None and hdr.layout != layout:
            raise BlockFileError(f"layout {hdr.layout!r}, expected {layout!r}")
        if hdr.dtype not in _DTYPES:
            raise BlockFileError(f"unknown dtype {hdr.dtype}")
        buf = bytearray(hdr.payload_len)
        n = f.readinto(buf)
        if n != hdr.payload_len or f.read(1):
            raise BlockFileError("payload length mismatch")
    if zlib.crc32(buf) != hdr.payload_crc:
        raise BlockFileError("payload checksum mismatch")
    t = torch.frombuffer(buf, dtype=torch.uint8).view(_DTYPES[hdr.dtype]).reshape(hdr.shape)
    return hdr, t
