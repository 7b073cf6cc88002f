"""bargein.session: everything between a client's socket and the engine, in four folders.

- :mod:`bargein.session.conversation`: one conversation as a pure state
  machine (``Conversation.handle(event, now) -> list[Action]``), its items,
  the chat template and its limits. No asyncio, no Redis, no voice.
- :mod:`bargein.session.streams`: the resumable streams: the token log
  (memory, Redis Streams, Redis Cluster) and the multi-node protocol
  (leases, forwarding, takeover). They know no connection.
- :mod:`bargein.session.runtime`: the node's asyncio runtime: the service
  (admission, the engine's outputs into the log), one connection per socket,
  delivery from the log at the client's pace, saved sessions.
- :mod:`bargein.session.voice_runtime`: one connection's voice: input audio
  into turns (VAD, transcription, speculation) and answers into speech.

Three modules serve all four: :mod:`~bargein.session.errors` (the exceptions
they raise), :mod:`~bargein.session.supervise` (long-lived tasks that never
stop silently) and :mod:`~bargein.session.cancel` (cancel-and-wait).
``tests/test_layers.py`` holds the rules of who imports whom.
"""
