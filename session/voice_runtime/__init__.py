"""One connection's voice: input audio into turns, answers into speech.

:class:`~.channel.VoiceChannel` runs the VAD, end-of-turn and transcription
of a connection's input audio (:mod:`.audio_input`, the process-wide
:class:`~.runtime.VoiceRuntime` threads) and a :class:`~.speaker.Speaker`
per answer; the models themselves live in :mod:`bargein.voice`.
"""
