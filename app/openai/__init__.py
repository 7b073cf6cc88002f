"""OpenAI-compatible HTTP endpoints: ``/v1/chat/completions``, ``/v1/completions``,
``/v1/models``, their request schema, SSE framing and the JSON fallbacks."""
