"""bargein.client: the Python client of bargein's realtime protocol (docs/protocol.md).

It speaks the wire contract and nothing else: it imports nothing of the
server (``tests/test_layers.py`` holds it to that), needs only the
``websockets`` package (``numpy`` and ``soxr`` only to convert WAV files),
and never loads torch.

- :mod:`~bargein.client.realtime_client`: :class:`RealtimeClient`: respond,
  cancel (barge-in), auto-resume of a dropped stream, a response's audio.
- :mod:`~bargein.client.voice_client`: :class:`VoiceClient`: the user's
  audio in real-time chunks, the turns the server's VAD finds followed.
- :mod:`~bargein.client.playback`: :class:`AnswerPlayer`: answers played in
  real time as the user hears them, paused and resumed by the server's
  confirmed interruptions, cut by a barge-in.
- :mod:`~bargein.client.pcm`: pcm16 audio: WAV files in and out, resampling, chunks.
- :mod:`~bargein.client.console`: terminal lines for ``bargein chat``.
"""

from bargein.client.pcm import WavSink, read_wav
from bargein.client.playback import AnswerPlayer, Playback
from bargein.client.realtime_client import RealtimeClient, Response, ServerError
from bargein.client.voice_client import VoiceClient, VoiceTurn, voice_settings

__all__ = [
    "AnswerPlayer",
    "Playback",
    "RealtimeClient",
    "Response",
    "ServerError",
    "VoiceClient",
    "VoiceTurn",
    "WavSink",
    "read_wav",
    "voice_settings",
]
