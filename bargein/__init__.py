"""bargein: realtime LLM serving over WebSockets.

One import name for the project's folders (pyproject.toml maps them):
:mod:`bargein.app` (HTTP and WebSocket server, CLI, client),
:mod:`bargein.session` (conversations, the token log, the cluster),
:mod:`bargein.engine` (continuous batching over a paged KV cache),
:mod:`bargein.protocol` (the wire contract, sans-I/O) and
``bargein.static`` (the browser page). Dependencies point one way:
app -> session -> engine, and every layer may use protocol.
"""
