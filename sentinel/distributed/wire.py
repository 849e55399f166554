"""The on-the-wire format of the dist backend: a fixed int64 header, then a body in bounded chunks.

Sender -> relay (one boundary message, after the sender's codec and adversary):

    header  int64[12]: MAGIC, step, mb, boundary, role, sender, receiver, manifest_len, data_len, 0, 0, 0
    body    uint8[manifest_len + data_len] in chunks of at most CHUNK bytes:
            manifest = JSON {"t": [[name, dtype, shape], ...], "m": codec meta}, then the raw bytes of
            each wire tensor in manifest order

Relay -> receiver (what the response policy delivered):

    header  int64[12]: MAGIC, step, mb, stage, kind (0 activation in, 1 gradient in), 0, 0, 0, 0, dropped, 0, 0
    payload float32 of the honest boundary shape, unless dropped

The relay never trusts a header: `parse_body` checks the manifest and the byte counts and raises
`WireError` on anything inconsistent; the relay drains an oversized body chunk by chunk into one
reused buffer instead of allocating it (memory stays bounded, the stream stays in sync). gloo aborts
a process whose receive size differs from the size sent, so the framing (a header followed by exactly
the bytes it announces) is the one thing the sending rank's transport code must get right; everything
above it -- tensors, shapes, dtypes, values, byte counts of the wire -- may be adversarial.
"""

from __future__ import annotations

import json
import math

import torch

from sentinel.transport.message import Role, Wire

MAGIC = 0x5E47_D157
HEADER_LEN = 12
CHUNK = 1 << 22  # bytes per body send: also the relay's scratch buffer when it drains a refused body
MAX_MANIFEST = 1 << 16
DTYPES = {
    "float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "int8": torch.int8, "uint8": torch.uint8, "int16": torch.int16, "int32": torch.int32, "int64": torch.int64,
    "bool": torch.bool,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
KIND_ACT, KIND_GRAD = 0, 1
CPU = torch.device("cpu")  # wires are decoded on the CPU, as in sim (codecs and detectors use CPU generators)


def body_limit(shape: tuple[int, ...]) -> int:
    """Largest body the relay accepts for a boundary tensor of `shape`: twice its float32 size plus a manifest."""
    return 2 * 4 * math.prod(shape) + MAX_MANIFEST


class WireError(ValueError):
    """A frame the relay refuses (the message is flagged and attributed to its sender)."""


def header(*fields: int) -> torch.Tensor:
    h = torch.zeros(HEADER_LEN, dtype=torch.int64)
    h[0] = MAGIC
    h[1 : 1 + len(fields)] = torch.tensor(fields, dtype=torch.int64)
    return h


def encode_body(wire: Wire) -> tuple[int, torch.Tensor]:
    """(manifest_len, body bytes) of a Wire; its meta must be JSON (codec headers are small and public)."""
    entries, blobs = [], []
    for name, t in wire.tensors.items():
        if t.dtype not in DTYPE_NAMES:
            raise TypeError(f"wire tensor {name!r} has dtype {t.dtype}, which the dist wire does not carry")
        entries.append([name, DTYPE_NAMES[t.dtype], list(t.shape)])
        blobs.append(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8))
    manifest = json.dumps({"t": entries, "m": wire.meta}, separators=(",", ":")).encode("utf-8")
    head = torch.frombuffer(bytearray(manifest), dtype=torch.uint8)
    return len(manifest), torch.cat([head, *blobs]) if blobs else head


def chunks(n: int) -> list[int]:
    """Sizes of the sends that carry an n-byte body."""
    return [min(CHUNK, n - i) for i in range(0, n, CHUNK)]


def send_body(comm, dst: int, body: torch.Tensor) -> None:
    offset = 0
    for size in chunks(body.numel()):
        comm.send(body[offset : offset + size], dst)
        offset += size


def recv_body(comm, src: int, nbytes: int, limit: int, what: str) -> torch.Tensor | None:
    """The body, or None after draining it when it exceeds `limit` bytes (never allocates more than CHUNK)."""
    if nbytes <= limit:
        parts = [comm.recv((size,), torch.uint8, src, what, CPU) for size in chunks(nbytes)]
        return torch.cat(parts) if len(parts) != 1 else parts[0]
    for size in chunks(nbytes):
        comm.recv((size,), torch.uint8, src, what, CPU)  # drained: read and discarded
    return None


def _entry(e) -> tuple[str, torch.dtype, tuple[int, ...]]:
    if not (isinstance(e, list) and len(e) == 3 and isinstance(e[0], str) and e[1] in DTYPES):
        raise WireError(f"bad manifest entry {str(e)[:80]}")
    shape = e[2]
    if not (isinstance(shape, list) and len(shape) <= 8 and all(isinstance(d, int) and d >= 0 for d in shape)):
        raise WireError(f"bad shape {str(shape)[:80]} for wire tensor {e[0]!r}")
    return e[0], DTYPES[e[1]], tuple(shape)


def parse_body(body: torch.Tensor, manifest_len: int) -> Wire:
    """Rebuild a Wire from a body, checking every count against the bytes actually received."""
    if not 0 < manifest_len <= min(MAX_MANIFEST, body.numel()):
        raise WireError(f"manifest length {manifest_len} out of range for a {body.numel()}-byte body")
    try:
        manifest = json.loads(bytes(body[:manifest_len].tolist()).decode("utf-8"))
        entries, meta = manifest["t"], manifest["m"]
    except (ValueError, KeyError, TypeError) as exc:
        raise WireError(f"unreadable manifest ({exc.__class__.__name__})") from None
    if not isinstance(entries, list) or not isinstance(meta, dict):
        raise WireError("manifest must hold a list of tensors and a meta mapping")
    tensors, offset = {}, manifest_len
    for e in entries:
        name, dtype, shape = _entry(e)
        n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        if name in tensors or offset + n > body.numel():
            raise WireError(f"wire tensor {name!r} duplicated or larger than the bytes sent")
        tensors[name] = body[offset : offset + n].clone().view(dtype).reshape(shape)
        offset += n
    if offset != body.numel():
        raise WireError(f"the manifest accounts for {offset} bytes but {body.numel()} were sent")
    return Wire(tensors, meta)


def message_header(msg, sender_idx: int, receiver_idx: int, manifest_len: int, data_len: int) -> torch.Tensor:
    return header(msg.step, msg.mb_idx, msg.boundary, int(msg.role), sender_idx, receiver_idx, manifest_len, data_len)


def expected_fields(step: int, mb: int, boundary: int, role: Role, sender_idx: int, receiver_idx: int) -> list[int]:
    return [MAGIC, step, mb, boundary, int(role), sender_idx, receiver_idx]
