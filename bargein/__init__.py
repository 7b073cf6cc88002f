"""bargein: realtime LLM serving over WebSockets.

One import name for the project's folders (pyproject.toml maps them):
:mod:`bargein.app` (HTTP and WebSocket server, settings, CLI),
:mod:`bargein.session` (conversations, the resumable streams, the node's
runtime, each connection's voice), :mod:`bargein.engine` (continuous
batching over a paged KV cache), :mod:`bargein.voice` (the speech models),
:mod:`bargein.protocol` (the wire contract, sans-I/O),
:mod:`bargein.client` (the Python client) and ``bargein.static`` (the
browser page). Dependencies point one way: app -> session -> engine and
voice; app and session use protocol; the client imports nothing of the
server. ``tests/test_layers.py`` holds the rules.
"""
