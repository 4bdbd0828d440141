"""Agents: the policy client, token-exact conversations, tool-call parsers and the collector.

Example (``with_collector(f)`` runs ``f(collector)``: a :class:`Collector` of 2 samples a
task on a running engine, see :mod:`vime.agents.collector` for the whole of it; ``tasks``:
2 math tasks):
    >>> episodes = with_collector(lambda c: c.collect(tasks, "vime/Math-v0"))
    >>> len(episodes), {e.env_id for e in episodes}
    (4, {'vime/Math-v0'})
"""

from __future__ import annotations

from vime.agents.chat_tokens import TEMPLATE_MISMATCH_MODES, ChatTokens
from vime.agents.collector import Collector, CollectorConfig
from vime.agents.policy_client import (
    Completion,
    ContextLengthError,
    EngineUnavailableError,
    PolicyClient,
    PolicyClientConfig,
)
from vime.agents.progress import CollectProgress
from vime.agents.tool_parsers import (
    PARSERS,
    get_parser,
    parse_hermes,
    parse_llama3_json,
    parse_tool_calls,
)

__all__ = [
    "PARSERS",
    "TEMPLATE_MISMATCH_MODES",
    "ChatTokens",
    "CollectProgress",
    "Collector",
    "CollectorConfig",
    "Completion",
    "ContextLengthError",
    "EngineUnavailableError",
    "PolicyClient",
    "PolicyClientConfig",
    "get_parser",
    "parse_hermes",
    "parse_llama3_json",
    "parse_tool_calls",
]
