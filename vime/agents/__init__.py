"""Agents: the policy client, token-exact conversations, tool-call parsers and the collector.

Example (the collection is skipped as a doctest: it needs a running vLLM server):
    >>> from vime.agents import Collector, CollectorConfig, PolicyClient
    >>> client = PolicyClient.from_urls("http://127.0.0.1:8000")
    >>> collector = Collector(client, model_dir, CollectorConfig(n_samples=4))  # doctest: +SKIP
    >>> episodes = await collector.collect(tasks, "vime/Math-v0")  # doctest: +SKIP
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
