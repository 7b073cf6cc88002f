"""The fence a token-log write checks: the writer still holds the stream's lease.

The cluster takes and renews leases (:mod:`bargein.session.streams.cluster.lease`);
the log only checks them, atomically with each step's write, so a node that
lost its lease can never write over its successor. The type lives with the
log so that the log does not depend on the cluster.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Fence:
    """What a write of one stream checks in Redis before it lands.

    Attributes:
        lease_key: the stream's lease (held by ``node_id``, or expired).
        epoch_key: the stream's fencing epoch.
        node_id: the writing node.
        epoch: the epoch the writer got when it took the lease.
    """

    lease_key: str
    epoch_key: str
    node_id: str
    epoch: int
