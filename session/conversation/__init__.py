"""One conversation, pure: events in, actions out; no asyncio, no Redis, no voice.

:class:`~bargein.session.conversation.state.Conversation` is the state machine
(turns, barge-in, truncation, items); :mod:`.actions` the internal events and
actions it speaks; :mod:`.chat` the chat template and the bounds that keep
tokenizing cheap; :mod:`.config` a session's limits and defaults.
"""
