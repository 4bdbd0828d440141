"""Models vime builds or inspects. The tiny local model lives in :mod:`vime.models.tiny`.

Example:
    >>> from vime.models import build_tiny_model
    >>> path = build_tiny_model()  # built once (about a second), then from the cache
    >>> sorted(p.name for p in path.glob("*.json"))[:2]
    ['config.json', 'generation_config.json']
"""

from vime.models.tiny import (
    EOS_TOKEN,
    EOS_TOKEN_ID,
    TINY_CHAT_TEMPLATE,
    TinyModelSpec,
    build_tiny_model,
    tiny_model_cache_path,
)

__all__ = [
    "EOS_TOKEN",
    "EOS_TOKEN_ID",
    "TINY_CHAT_TEMPLATE",
    "TinyModelSpec",
    "build_tiny_model",
    "tiny_model_cache_path",
]
