"""`language:response_language`: the response is written in a given language (langdetect, seeded)."""

from __future__ import annotations

from resources_servers.instruction_following.checkers.base import Checker, Kwargs, NotFollowed, Text

# The reference's language table: codes outside it are rejected, so Chinese (langdetect says `zh-cn`/`zh-tw`) and
# every other language can never be asked for.
LANGUAGES = frozenset(
    "en es pt ar hi fr ru de ja it bn uk th ur ta te bg ko pl he fa vi ne sw kn mr gu pa ml fi".split()
)


class ResponseLanguage(Checker):
    """langdetect's code for the response equals `language`; text langdetect cannot read (no letters) passes."""

    kwargs = ("language",)

    def __init__(self, kwargs: Kwargs) -> None:
        language = kwargs.values.get("language")
        if language is None:
            raise kwargs.missing("language")
        if not isinstance(language, str) or language not in LANGUAGES:
            raise NotFollowed(f"language {language!r} is not one of {sorted(LANGUAGES)}")
        self.language = language

    def check(self, text: Text) -> bool:
        detected = text.language
        return detected is None or detected == self.language
