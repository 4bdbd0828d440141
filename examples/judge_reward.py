"""An LLM judge as ``rollout.reward`` (docs/extend.md): a served model grades each answer.

    VIME_JUDGE_URL=http://127.0.0.1:8001 vime-agent train rollout.reward=examples/judge_reward.py:reward

The judge is any OpenAI-compatible server (``vime-agent serve``, ``vllm serve``, an API);
``VIME_JUDGE_MODEL`` names its model (default: the first it lists). The first number of
its reply, 0 to 10, is the reward scaled to [0, 1]; a reply without one scores 0. A judge
that cannot be reached raises: the episode ends in error with the reason.
"""

from __future__ import annotations

import os
import re
from typing import Any

import httpx

if not os.environ.get("VIME_JUDGE_URL"):  # checked when the run loads this file, at start
    raise RuntimeError("set VIME_JUDGE_URL to the judge's URL, e.g. http://127.0.0.1:8001")

PROMPT = """Question: {question}
Reference answer: {answer}
Student's answer: {response}

Is the student's answer right? Reply with one score from 0 (wrong) to 10 (right)."""
TIMEOUT_S = 120.0


async def reward(task: dict[str, Any], episode: Any) -> float:
    """Ask the judge about the episode's last answer; its score in [0, 1]."""
    replies = [m["content"] for m in episode.messages if m["role"] == "assistant"]
    prompt = PROMPT.format(
        question=task.get("question", ""),
        answer=task.get("answer", "(none given)"),
        response=replies[-1] if replies else "",
    )
    url = os.environ["VIME_JUDGE_URL"].rstrip("/")
    # A client per call: the collector may call from more than one event loop (training, eval).
    async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT_S) as judge:
        model = os.environ.get("VIME_JUDGE_MODEL") or await _first_model(judge)
        request = {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 8,
            "temperature": 0.0,
        }
        response = await judge.post("/v1/chat/completions", json=request)
        response.raise_for_status()
    return parse_score(response.json()["choices"][0]["message"]["content"] or "")


def parse_score(text: str) -> float:
    """The reply's first number, 0 to 10 (clipped), scaled to [0, 1]; 0 without one.

    Example:
        >>> parse_score("Score: 7/10"), parse_score("right"), parse_score("12")
        (0.7, 0.0, 1.0)
    """
    found = re.search(r"\d+(?:\.\d+)?", text)
    return min(float(found.group()), 10.0) / 10.0 if found else 0.0


async def _first_model(judge: httpx.AsyncClient) -> str:
    listed = await judge.get("/v1/models")
    listed.raise_for_status()
    return str(listed.json()["data"][0]["id"])
