"""The on-the-wire format of the distributed backend: fixed int64 headers, then bodies in bounded chunks.

Every frame starts with `header` = int64[12]: MAGIC, KIND, then fields by kind:

    MSG      worker -> verifier: step, mb, boundary, role, sender, receiver, manifest_len, data_len, inline; the
             body: manifest = JSON {"t": [[name, dtype, shape], ...], "m": codec meta}, then the raw bytes of each
             wire tensor in manifest order; `inline` when it travels in the frame's own slot (it fits: every
             honest codec's body does), else after it in chunks of at most CHUNK bytes (uint8)
    SKIP     worker -> verifier: step, mb, boundary, role, sender, receiver: this slot's message will not come
             (the sender's own input was dropped upstream)
    DELIVER  verifier -> worker: step, mb, stage, role, dropped; and the float32 payload of the honest
             boundary shape (the receiving `stage`'s input for that microbatch; zeros when dropped)
    STATUS   verifier -> neighbouring verifier: step, mb, boundary, role, tainted, has_payload; then the delivered
             payload when the detector needs the sender's inputs (`Detector.wants_inputs`)
    END      any -> any: no more frames in this job

Between a worker and a verifier every frame is one fixed-size *slot* (`pack`): the header's bytes, then the
frame's body where it fits (`deliver_slot` bytes towards a worker, `message_slot` towards a verifier), so an
honest message costs one send and one receive each way. Between verifiers a frame is its header, then its
body.

Workers and verifiers address each other by worker-table index. The verifier never trusts a header: the
manifest and the byte counts are checked (`parse_body` raises `WireError`), an oversized body is drained chunk
by chunk into one reused buffer instead of being allocated. gloo aborts a process whose receive size differs
from the size sent, so the framing (a header followed by exactly the bytes it announces) is the one thing the
sending rank's transport code must get right; everything above it may be adversarial.
"""

from __future__ import annotations

import json
import math

import torch

from sentinel.transport.message import Wire
from sentinel.transport.relay import WireError  # noqa: F401  (raised by parse_body)

MAGIC = 0x5E47_D157
HEADER_LEN = 12
MSG, SKIP, DELIVER, STATUS, END = 1, 2, 3, 4, 5
CHUNK = 1 << 22  # bytes per body send: also the relay's scratch buffer when it drains a refused body
MAX_MANIFEST = 1 << 16
DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "bool": torch.bool,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
CPU = torch.device("cpu")  # wires are decoded on the CPU, as in sim (codecs and detectors use CPU generators)


def body_limit(shape: tuple[int, ...]) -> int:
    """Largest body the relay accepts for a boundary tensor of `shape`: twice its float32 size plus a manifest."""
    return 2 * 4 * math.prod(shape) + MAX_MANIFEST


def header(kind: int, *fields: int) -> torch.Tensor:
    return torch.tensor([MAGIC, kind, *fields, *(0,) * (HEADER_LEN - 2 - len(fields))], dtype=torch.int64)


HEAD_BYTES = 8 * HEADER_LEN
INLINE_SPARE = 4096  # a message slot's room beyond a float32 payload: the manifest and a codec's extras


def deliver_slot(shape: tuple[int, ...]) -> int:
    """Size of a verifier -> worker frame: a header and a float32 payload of the boundary shape."""
    return HEAD_BYTES + 4 * math.prod(shape)


def message_slot(shape: tuple[int, ...]) -> int:
    """Size of a worker -> verifier frame: a header and a body of up to a float32 payload plus INLINE_SPARE."""
    return HEAD_BYTES + 4 * math.prod(shape) + INLINE_SPARE


def pack(head: torch.Tensor, body: torch.Tensor | None, size: int) -> torch.Tensor:
    """One slot of `size` bytes: the header, then `body` (any dtype, as bytes; it must fit), zeros after."""
    buf = torch.zeros(size, dtype=torch.uint8)
    buf[:HEAD_BYTES] = head.view(torch.uint8)
    if body is not None:
        raw = body.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
        buf[HEAD_BYTES : HEAD_BYTES + raw.numel()] = raw
    return buf


def unpack(buf: torch.Tensor) -> tuple[list[int], torch.Tensor]:
    """(header, the bytes after it) of a slot."""
    return buf[:HEAD_BYTES].view(torch.int64).tolist(), buf[HEAD_BYTES:]


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


def split_body(body: torch.Tensor) -> list[torch.Tensor]:
    """The pieces (views) a body travels in: at most CHUNK bytes each."""
    out, offset = [], 0
    for size in chunks(body.numel()):
        out.append(body[offset : offset + size])
        offset += size
    return out


def recv_body(comm, src: int, nbytes: int, limit: int, what: str) -> torch.Tensor | None:
    """The body, or None after draining it when it exceeds `limit` bytes (never allocates more than CHUNK)."""
    if nbytes == 0:
        return torch.empty(0, dtype=torch.uint8)
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
        manifest = json.loads(body[:manifest_len].numpy().tobytes().decode("utf-8"))
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


def message_header(
    msg, sender_idx: int, receiver_idx: int, manifest_len: int, data_len: int, inline: bool = False
) -> torch.Tensor:
    return header(
        MSG,
        msg.step,
        msg.mb_idx,
        msg.boundary,
        int(msg.role),
        sender_idx,
        receiver_idx,
        manifest_len,
        data_len,
        int(inline),
    )
