"""Post-codec tampering: which tensors of a codec's `Wire` an attack acts on.

With `placement: post_codec` an attack tampers with what travels (after `codec.encode`), not with the
tensor the sender computed. Which wire tensors carry the content depends on the codec: the identity
codec sends one tensor "x"; a masking or subspace codec may send coefficients plus side tensors that
must not be touched (indices, seeds). A codec registers its content fields here; an unregistered
codec's floating-point tensors are all tampered with.
"""

from __future__ import annotations

from sentinel.transport.message import Wire

WIRE_FIELDS: dict[str, tuple[str, ...]] = {"identity": ("x",)}


def register_wire_fields(codec_name: str, fields: tuple[str, ...]) -> None:
    """Declare which wire tensors of `codec_name` carry the message content."""
    WIRE_FIELDS[codec_name] = tuple(fields)


def wire_fields(codec_name: str, wire: Wire) -> list[str]:
    """The wire tensors a post-codec attack acts on, in a stable order."""
    names = WIRE_FIELDS.get(codec_name)
    if names is None:
        names = tuple(sorted(k for k, t in wire.tensors.items() if t.is_floating_point()))
    return [n for n in names if n in wire.tensors]
