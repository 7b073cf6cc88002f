"""One connection's voice: input audio into turns, answers into speech.

:class:`~.channel.VoiceChannel` is the voice side plugged into a connection
(the seam is :mod:`bargein.session.runtime.voice_port`; :func:`~.channel.plug`
makes it for the app): it runs the VAD, end-of-turn and transcription of the
connection's input audio (:mod:`.audio_input`, in the process-wide
:class:`~.runtime.VoiceRuntime` threads) and reports barge-ins and turns to
the connection; a :class:`~.speaker.Speaker` per spoken answer subscribes
to its delivery (:mod:`.spoken`). The models themselves live in
:mod:`bargein.voice`.
"""
