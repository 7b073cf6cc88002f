"""Voice: the audio around a conversation (VAD, speech-to-text, text-to-speech).

Below the session layer and beside the engine: nothing here knows of
sessions, the token log or the app. Pure logic (turn detection, segmenting
text for speech, the ms <-> characters alignment) lives apart from the model
wrappers (Silero VAD, faster-whisper, Piper), which are loaded only when the
voice stack is installed (:mod:`bargein.voice.models`).
"""
