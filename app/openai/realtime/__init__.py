"""OpenAI's Realtime API (GA schema) on ``/v1/realtime``, over bargein's sessions.

``inbound``: OpenAI client events to bargein session events; ``outbound``:
bargein server events to OpenAI's; ``endpoint``: the dispatch rule and one
connection's glue. docs/protocol.md section 11 is the contract.
"""
