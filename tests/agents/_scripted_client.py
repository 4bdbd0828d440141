"""A scripted stand-in for :class:`vime.agents.PolicyClient`: the collector tests that need
no engine play real episodes on it.

Example (skipped as a doctest: it needs the tiny tokenizer, the ``tok`` fixture):
    >>> Collector(ScriptedClient(tok, "Two."), tok, CollectorConfig())  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from vime.agents.policy_client import Completion


class ScriptedClient:
    """Stands in for PolicyClient: every turn samples ``text`` and ends it."""

    def __init__(self, tok: Any, text: str = "Hi") -> None:
        self.ids = [*tok.encode(text, add_special_tokens=False), tok.eos_token_id]

    async def model_name(self) -> str:
        return "scripted"

    async def max_model_len(self) -> int:
        return 4096

    async def generate(self, prompt_ids, params, *, session, max_tokens=None) -> Completion:
        return Completion(list(self.ids), [-0.5] * len(self.ids), "stop", 0, "scripted")

    def release(self, session: str) -> None:
        pass
