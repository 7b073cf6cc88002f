"""Read a GGUF file's header and map its tensors, without copying them.

The container format is ggml's (``docs/gguf.md`` in ggml/llama.cpp): a magic,
a version, the metadata key-value pairs, the tensor infos (name, dims with
the fastest-varying first, ggml type, offset), then the tensors' bytes from
an aligned data offset. The ``gguf`` package's ``GGUFReader`` reads the same
format, but it builds a numpy view per string of the vocabulary: 6.2 s for
SmolLM2's 49,152 tokens and 48,900 merges here (one run, 2026-12-04), about
20 s for a 151,936-token Qwen2.5 vocabulary, at every start. This reader
parses the header with :mod:`struct` (the SmolLM2 file in about 0.1 s) and
maps the data with :mod:`mmap`: a tensor is read only when used, and its
pages belong to the page cache, not to the process, until then.
The ggml types' block sizes come from the ``gguf`` package
(``GGML_QUANT_SIZES``).
"""

from __future__ import annotations

import hashlib
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32

# value types of the metadata (gguf.md "GGUFValueType") -> struct format
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9
_NUMPY = {
    0: "<u1",
    1: "<i1",
    2: "<u2",
    3: "<i2",
    4: "<u4",
    5: "<i4",
    6: "<f4",
    7: "<u1",
    10: "<u8",
    11: "<i8",
    12: "<f8",
}


class GgufError(ValueError):
    """The file is not a GGUF this reader understands (bad magic, version, type or bounds)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorInfo:
    """One tensor of a GGUF file.

    Attributes:
        name: the GGUF name (``blk.0.attn_q.weight``).
        ggml_type: the ggml type (``GGMLQuantizationType``).
        shape: torch order, slowest first: ``(out, in)`` for a matrix (GGUF
            stores ``ne`` fastest first, so this is ``ne`` reversed).
        offset: byte offset of its data in the file.
        nbytes: size of its data.
    """

    name: str
    ggml_type: GGMLQuantizationType
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class GgufFile:
    """A parsed GGUF header and the file mapped read-only.

    Attributes:
        path: the file.
        version: the GGUF version (2 or 3).
        metadata: key -> value (ints, floats, bools, str, lists of them).
        tensors: name -> :class:`TensorInfo`, in file order.
        header_sha256: hex SHA-256 of the bytes before the tensor data: a key
            of everything derived from the metadata (the tokenizer), cheap to
            compute for any file size.
        data: the whole file, ``uint8``, memory-mapped read-only.
        mapping: the map under ``data`` (for :meth:`release`).
    """

    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo]
    header_sha256: str
    data: np.ndarray
    mapping: mmap.mmap

    def release(self, name: str) -> None:
        """Drop the tensor's pages from this process's memory (``MADV_DONTNEED``
        on the read-only map: they stay in the page cache and come back on the
        next read). Called once a tensor is copied into its kernel layout, so
        the file's pages do not count in the process's RSS beside the copy."""
        info = self.tensors[name]
        start = info.offset // mmap.PAGESIZE * mmap.PAGESIZE
        self.mapping.madvise(mmap.MADV_DONTNEED, start, info.offset + info.nbytes - start)

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes, ``[rows, row_bytes]`` uint8 (a view of the map;
        a row is a run of blocks along the last dim).

        Raises:
            KeyError: no tensor of that name.
        """
        info = self.tensors[name]
        rows = int(np.prod(info.shape[:-1], dtype=np.int64)) if len(info.shape) > 1 else 1
        return self.data[info.offset : info.offset + info.nbytes].reshape(rows, info.nbytes // rows)


def tensor_nbytes(ggml_type: GGMLQuantizationType, shape: tuple[int, ...]) -> int:
    """Bytes of a tensor of ``shape`` (torch order) in ``ggml_type``.

    Raises:
        GgufError: the last dim is not a whole number of the type's blocks.
    """
    block, size = GGML_QUANT_SIZES[ggml_type]
    if shape[-1] % block:
        raise GgufError(f"a {ggml_type.name} row of {shape[-1]} is not a whole number of {block}-blocks")
    return int(np.prod(shape, dtype=np.int64)) // block * size


class _Cursor:
    """Sequential little-endian reads over the mapped header."""

    def __init__(self, buffer: memoryview) -> None:
        self.buffer = buffer
        self.pos = 0

    def unpack(self, fmt: str) -> Any:
        try:
            (value,) = struct.unpack_from(fmt, self.buffer, self.pos)
        except struct.error as exc:
            raise GgufError(f"header ends early at byte {self.pos}") from exc
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.unpack("<Q")
        if self.pos + n > len(self.buffer):
            raise GgufError(f"a string of {n} bytes at byte {self.pos} runs past the file")
        text = bytes(self.buffer[self.pos : self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return text

    def value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.unpack("<I"), self.unpack("<Q")
            if item in _NUMPY:  # numbers in one read
                dtype = np.dtype(_NUMPY[item])
                end = self.pos + count * dtype.itemsize
                if end > len(self.buffer):
                    raise GgufError(f"an array of {count} at byte {self.pos} runs past the file")
                values = np.frombuffer(self.buffer[self.pos : end], dtype).tolist()
                self.pos = end
                return [bool(v) for v in values] if item == 7 else values
            return [self.value(item) for _ in range(count)]
        raise GgufError(f"unknown metadata value type {kind} at byte {self.pos}")


def read_gguf(path: str | Path) -> GgufFile:
    """Parse ``path``'s header and map its data.

    Raises:
        FileNotFoundError: no such file.
        GgufError: not a GGUF (magic), an unsupported version, an unknown
            tensor type, or a tensor that runs past the end of the file.
    """
    path = Path(path)
    with path.open("rb") as f:
        mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)  # the map outlives the descriptor
    data = np.frombuffer(mapping, dtype=np.uint8)
    cursor = _Cursor(memoryview(mapping))
    if bytes(data[:4]) != MAGIC:
        raise GgufError(f"{str(path)!r} is not a GGUF file (magic {bytes(data[:4])!r})")
    cursor.pos = 4
    version = cursor.unpack("<I")
    if version not in SUPPORTED_VERSIONS:
        raise GgufError(f"GGUF version {version} (supported: {SUPPORTED_VERSIONS})")
    n_tensors, n_kv = cursor.unpack("<Q"), cursor.unpack("<Q")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cursor.string()
        metadata[key] = cursor.value(cursor.unpack("<I"))
    infos = []
    for _ in range(n_tensors):
        name = cursor.string()
        dims = [cursor.unpack("<Q") for _ in range(cursor.unpack("<I"))]
        kind, offset = cursor.unpack("<I"), cursor.unpack("<Q")
        try:
            ggml_type = GGMLQuantizationType(kind)
        except ValueError as exc:
            raise GgufError(f"tensor {name!r} has unknown ggml type {kind}") from exc
        infos.append((name, ggml_type, tuple(reversed(dims)), offset))
    alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
    start = -(-cursor.pos // alignment) * alignment
    tensors = {}
    for name, ggml_type, shape, offset in infos:
        nbytes = tensor_nbytes(ggml_type, shape)
        if start + offset + nbytes > len(data):
            raise GgufError(f"tensor {name!r} runs past the end of the file (truncated download?)")
        tensors[name] = TensorInfo(
            name=name, ggml_type=ggml_type, shape=shape, offset=start + offset, nbytes=nbytes
        )
    header_sha256 = hashlib.sha256(mapping[:start]).hexdigest()
    return GgufFile(
        path=path,
        version=version,
        metadata=metadata,
        tensors=tensors,
        header_sha256=header_sha256,
        data=data,
        mapping=mapping,
    )
