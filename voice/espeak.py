"""IPA of words from Debian's ``espeak-ng`` binary, run as a subprocess.

espeak-ng is GPL-3.0 and bargein Apache-2.0: it runs in its own process, never
linked into ours. ``espeak-ng -q --ipa`` reads text on stdin and prints the IPA
of each input line on its own line (punctuation dropped), so the words of a
text go in one call, one word a line, and come back one line each.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Sequence

from .errors import PhonemizeError, VoiceUnavailable

ESPEAK_BINARY = "espeak-ng"
_TIMEOUT_S = 10.0
# A word espeak reads in another language comes back wrapped in language
# switches such as "(fr)" ... "(en)": they are not phonemes.
_LANGUAGE_SWITCH = re.compile(r"\([a-z]{2,3}(?:-[a-z0-9]+)*\)")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def espeak_binary() -> str:
    """Full path of ``espeak-ng`` on PATH.

    Raises:
        VoiceUnavailable: it is not installed.
    """
    path = shutil.which(ESPEAK_BINARY)
    if path is None:
        raise VoiceUnavailable(
            f"{ESPEAK_BINARY} is not on PATH: `apt-get install espeak-ng` (`make system-deps`)"
        )
    return path


class Espeak:
    """Phonemizes words with one espeak-ng voice (``en-us`` for the bundled Piper voice).

    Each call starts a process (about 5-15 ms for a sentence); calls from
    several threads at once are safe.
    """

    def __init__(self, voice: str = "en-us") -> None:
        self.voice = voice
        self._binary = espeak_binary()

    def phonemize(self, words: Sequence[str]) -> list[str]:
        """IPA of each word, in order; ``""`` for a word espeak-ng does not speak (``"..."``).

        Words must hold no line breaks (split on whitespace). If espeak-ng
        answers with a different number of lines than words (it split or
        merged one), each word is asked for again on its own.

        Raises:
            PhonemizeError: espeak-ng failed.
        """
        if not words:
            return []
        lines = self._run(words)
        if len(lines) == len(words):
            return lines
        return [" ".join(self._run([word])) for word in words]

    def _run(self, words: Sequence[str]) -> list[str]:
        # control characters could end a line or the input early: a word keeps none
        text = "".join(f"{_CONTROL.sub('', word)}\n" for word in words)
        try:
            done = subprocess.run(
                [self._binary, "-q", "--ipa", "-b", "1", "-v", self.voice],
                input=text.encode(),
                capture_output=True,
                timeout=_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise PhonemizeError(f"{ESPEAK_BINARY} could not phonemize {len(words)} words: {exc}") from exc
        if done.returncode:
            stderr = done.stderr.decode(errors="replace").strip()
            raise PhonemizeError(f"{ESPEAK_BINARY} exited {done.returncode}: {stderr}")
        out = done.stdout.decode(errors="replace")
        return [_LANGUAGE_SWITCH.sub("", line).strip() for line in out.splitlines()]
