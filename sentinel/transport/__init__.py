"""Transport: the single choke point every boundary tensor passes through.

    sender -> [adversary.pre_codec] -> codec.encode -> [adversary.post_codec] -> channel
           -> checks -> codec.decode -> EventLog -> verifier.observe -> response.deliver -> receiver

The two halves (`Sender`, `Relay`, in relay.py) run in one process in `sim` and in the sender's and the
verifier's processes on the distributed backend; a backend only supplies the channel in between.
"""

from sentinel.transport.message import Message, Role, Wire, canonical_key, message_id
from sentinel.transport.relay import (
    Delivery,
    InFlight,
    Interceptor,
    Relay,
    Responder,
    Sender,
    SenderInputs,
    Verifier,
    WireError,
)

__all__ = [
    "Delivery",
    "InFlight",
    "Interceptor",
    "Message",
    "Relay",
    "Responder",
    "Role",
    "Sender",
    "SenderInputs",
    "Verifier",
    "Wire",
    "WireError",
    "canonical_key",
    "message_id",
]
