"""The node's asyncio runtime: the service, its connections, delivery and admission.

:class:`~.service.Service` (one per node) admits requests, submits them to the
engine and writes each step's outputs to the token log; a
:class:`~.connection.Connection` (one per socket) runs a conversation's actions;
:class:`~.delivery.Delivery` reads a stream from the log at the client's pace.
A connection's voice side is plugged in through :mod:`.voice_port`: nothing
here imports :mod:`bargein.session.voice_runtime`.
"""
