"""Several bargein nodes on one Redis: leases, takeover, forwarded interrupts.

:class:`Cluster` (:mod:`~bargein.session.streams.cluster.coordinator`) is one node's
part; :mod:`~bargein.session.streams.cluster.lease` says which node generates a
stream, :mod:`~bargein.session.streams.cluster.adopt` takes over a stream whose node
died and :mod:`~bargein.session.streams.cluster.takeover` says how its continuation
joins it, :mod:`~bargein.session.streams.cluster.forward` carries a cancel to the node
generating the stream.
"""

from bargein.session.streams.cluster.coordinator import Cluster

__all__ = ["Cluster"]
