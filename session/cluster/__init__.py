"""Several bargein nodes on one Redis: leases, takeover, forwarded interrupts.

:class:`Cluster` (:mod:`~bargein.session.cluster.coordinator`) is one node's
part; :mod:`~bargein.session.cluster.lease` says which node generates a
stream, :mod:`~bargein.session.cluster.takeover` continues a stream whose node
died, :mod:`~bargein.session.cluster.forward` carries a cancel to the node
generating the stream.
"""

from bargein.session.cluster.coordinator import Cluster

__all__ = ["Cluster"]
