"""ChatTokens: one episode's conversation as exact token ids, built append-only.

The rule (docs/design.md, Invariants, 1): model output is never re-tokenized.

- The env's opening messages (and its tools) are rendered with the tokenizer's chat
  template once, with the generation prompt; those ids are the prompt (loss_mask 0).
- After each policy turn the ids vLLM sampled are appended verbatim (loss_mask 1), with
  vLLM's log-prob and the weight version beside each.
- For the env's new messages, the whole conversation is re-rendered (as text) and only
  the part after what the tokens already hold is tokenized and appended (loss_mask 0):
  the template's glue after the end-of-turn token (``"\\n"`` in ChatML), the new
  messages, and the next generation prompt. Before that, the text the tokens decode to
  must be a prefix of the new render. The check is done on text because a sampled turn
  is often not the canonical tokenization of its own text (the policy may spell
  ``<tool_call>`` as three tokens); re-tokenizing it would train on ids the model never
  produced.

The assistant turn enters the rendered conversation as its raw decoded text (tool calls
included verbatim), never as structured ``tool_calls``: a template re-serializing the
JSON would not reproduce what the model wrote.

A sampled turn that stops on a different end-of-turn token than the template's own
(``<|endoftext|>`` where the template writes ``<|im_end|>``) is accepted: the sampled
token stays, the template's token is not added a second time.

When the prefix check fails the template is not append-only (it rewrites history, e.g.
strips earlier ``<think>`` blocks, or merges turns). A :class:`~vime.errors.TemplateError`
naming the env id is recorded in :attr:`ChatTokens.mismatches`, and
``on_template_mismatch`` decides what happens:

- ``"keep_history"`` (default): the tokens keep the exact history the model saw and
  produced; from then on new messages are tokenized as the template renders them after
  an assistant turn (rendered against a fixed two-message base conversation).
- ``"restart_context"``: the tokens are replaced by the template's fresh render of the
  conversation, as a chat deployment would show it; earlier sampled turns become
  context (loss_mask 0, not trained on).
- ``"error"``: raise the :class:`~vime.errors.TemplateError` (the episode ends in ``error``).

Example (the tiny model's tokenizer; the policy spells "Hello" letter by letter, which is
not how the tokenizer would encode it, and the tokens keep that spelling):
    >>> from transformers import AutoTokenizer
    >>> from vime.models.tiny import build_tiny_model
    >>> tok = AutoTokenizer.from_pretrained(build_tiny_model())
    >>> chat = ChatTokens(tok, [{"role": "user", "content": "Hi"}])
    >>> sampled = tok.convert_tokens_to_ids(list("Hello")) + [tok.eos_token_id]
    >>> sampled[:-1] == tok.encode("Hello")
    False
    >>> chat.add_sampled(sampled, [-0.5] * len(sampled), weight_version=0)
    'Hello'
    >>> chat.add_messages([{"role": "user", "content": "More"}])
    True
    >>> chat.tokens[chat.prompt_len : chat.prompt_len + len(sampled)] == sampled
    True
    >>> tok.decode(chat.tokens) == chat.render(chat.messages, add_generation_prompt=True)
    True
"""

from __future__ import annotations

import logging
import re
from typing import Any

from vime.agents.tokenizer_memo import memo_of, prompt_key
from vime.errors import TemplateError
from vime.types import Message

logger = logging.getLogger(__name__)

TEMPLATE_MISMATCH_MODES = ("keep_history", "restart_context", "error")

# Content of the fixed base conversation used after a mismatch; unlikely to occur in glue.
_MARK = "\u2063vime\u2063"
_SURROGATE = re.compile("[\ud800-\udfff]")


class ChatTokens:
    """Token-exact, append-only conversation for one episode.

    Attributes:
        tokens: every token id of the episode so far.
        loss_mask: 1 where the policy sampled the token, else 0.
        logprobs: vLLM's log-prob for sampled tokens, 0.0 elsewhere.
        weight_versions: engine weight version for sampled tokens, -1 elsewhere.
        messages: the conversation as rendered (assistant turns as raw text).
        prompt_len: number of tokens of the opening render.
        sample_starts: where each training sample starts in ``tokens`` (``[0]`` here).
        mismatches: one message per template violation seen (empty when append-only).

    Example:
        >>> from transformers import AutoTokenizer
        >>> from vime.models.tiny import build_tiny_model
        >>> tok = AutoTokenizer.from_pretrained(build_tiny_model())
        >>> chat = ChatTokens(tok, [{"role": "user", "content": "Hi"}])
        >>> chat.tokens == tok.encode(chat.render(chat.messages, True))
        True
        >>> chat.prompt_len == len(chat.tokens), sum(chat.loss_mask)
        (True, 0)
    """

    def __init__(
        self,
        tokenizer: Any,
        messages: list[Message],
        *,
        tools: list[dict[str, Any]] | None = None,
        env_id: str = "",
        on_template_mismatch: str = "keep_history",
        chat_template_kwargs: dict[str, Any] | None = None,
        prompt_ids: list[int] | None = None,
    ) -> None:
        from vime.config import require_choice

        require_choice(on_template_mismatch, "on_template_mismatch", TEMPLATE_MISMATCH_MODES)
        self.tokenizer = tokenizer
        # Fast (Rust) tokenizers expose their backend; slow ones go through transformers.
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        self.tools = tools or None
        self.env_id = env_id
        self.on_template_mismatch = on_template_mismatch
        self.template_kwargs = dict(chat_template_kwargs or {})
        self.messages: list[Message] = [dict(m) for m in messages]
        self.mismatches: list[str] = []
        self.stop_substitutions = 0
        # Special tokens end a turn; their text is what a template writes at a turn's end.
        memo = memo_of(tokenizer)
        self._special_ids = memo.special_ids
        self._special_texts = memo.special_texts
        # After a mismatch in keep_history mode, renders of the full history are useless.
        self._delta_mode = False
        # Where each training sample starts in ``tokens``; [0]: the episode is one sample
        # (vime.agents.turn_samples starts one per turn the template re-renders).
        self.sample_starts: list[int] = [0]

        if prompt_ids is None:  # a group's n samples open alike: rendered once (memo)
            template = getattr(tokenizer, "chat_template", None)
            key = prompt_key(self.messages, self.tools, self.template_kwargs, template)
            text, opening = memo.prompt(key, self._render_prompt)
            ids = list(opening)
        else:
            text, ids = self.render(self.messages, add_generation_prompt=True), list(prompt_ids)
        self.tokens: list[int] = ids
        self.loss_mask: list[int] = [0] * len(ids)
        self.logprobs: list[float] = [0.0] * len(ids)
        self.weight_versions: list[int] = [-1] * len(ids)
        self.prompt_len = len(ids)
        # What self.tokens decode to, in the template's text space (see the module doc).
        self._text = text
        # Length of _text before the last sampled stop token (None: the turn had none).
        self._text_before_stop: int | None = None
        self._turn_open = False

    # ------------------------------------------------------------------ rendering

    def _render_prompt(self) -> tuple[str, list[int]]:
        """The opening messages' text, with the generation prompt, and its ids."""
        text = self.render(self.messages, add_generation_prompt=True)
        return text, self.encode(text)

    def render(self, messages: list[Message], add_generation_prompt: bool) -> str:
        """Render ``messages`` (with this episode's tools) to text with the chat template.

        Example:
            >>> from transformers import AutoTokenizer
            >>> from vime.models.tiny import build_tiny_model
            >>> tok = AutoTokenizer.from_pretrained(build_tiny_model())
            >>> chat = ChatTokens(tok, [{"role": "user", "content": "Hi"}])
            >>> chat.render([{"role": "user", "content": "Hi"}], True)
            '<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n'
        """
        try:
            text = self.tokenizer.apply_chat_template(
                messages,
                tools=self.tools,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                **self.template_kwargs,
            )
        except Exception as err:  # jinja errors, role-order checks in templates
            raise TemplateError(
                f"env {self.env_id!r}: the chat template failed to render the conversation "
                f"({type(err).__name__}: {err}); check the roles and fields of the env's messages"
            ) from err
        if not isinstance(text, str):
            raise TemplateError(f"env {self.env_id!r}: apply_chat_template did not return text")
        # A lone surrogate (an env's bytes decoded with surrogateescape) is no UTF-8 and
        # the tokenizer refuses it; every render maps it the same way, so prefixes hold.
        return _SURROGATE.sub("\ufffd", text)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without added BOS/EOS (the template writes those itself)."""
        if self._backend is not None:  # the Rust tokenizer itself: same ids, a fraction of the cost
            return list(self._backend.encode(text, add_special_tokens=False).ids)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        """Exact text of ``ids`` (special tokens kept, no whitespace clean-up)."""
        if self._backend is not None:
            return str(self._backend.decode(ids, skip_special_tokens=False))
        return str(
            self.tokenizer.decode(
                ids, skip_special_tokens=False, clean_up_tokenization_spaces=False
            )
        )

    # ------------------------------------------------------------------ appending

    def _append(
        self, ids: list[int], mask: int, logprobs: list[float] | None, version: int | list[int]
    ) -> None:
        self.tokens.extend(ids)
        self.loss_mask.extend([mask] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))
        self.weight_versions.extend(version if isinstance(version, list) else [version] * len(ids))

    def add_sampled(
        self, token_ids: list[int], logprobs: list[float], weight_version: int | list[int] = -1
    ) -> str:
        """Append one policy turn verbatim; return its text (the assistant message content).

        ``weight_version`` is the engine's version for the whole turn, or one per token
        (a turn continued across a weight sync).

        The text excludes a final end-of-turn special token (``<|im_end|>``), which the
        template writes itself when the conversation is rendered.

        Example:
            >>> from transformers import AutoTokenizer
            >>> from vime.models.tiny import build_tiny_model
            >>> tok = AutoTokenizer.from_pretrained(build_tiny_model())
            >>> chat = ChatTokens(tok, [{"role": "user", "content": "Hi"}])
            >>> ids = tok.encode("Hi") + [tok.eos_token_id]  # ends on <|im_end|>
            >>> chat.add_sampled(ids, [-0.1] * len(ids), weight_version=3)
            'Hi'
            >>> chat.loss_mask[-len(ids) :], chat.weight_versions[-len(ids) :]
            ([1, 1, 1], [3, 3, 3])
        """
        versions = weight_version if isinstance(weight_version, list) else None
        if len(token_ids) != len(logprobs) or (versions and len(versions) != len(token_ids)):
            raise TemplateError(
                f"env {self.env_id!r}: {len(token_ids)} sampled ids but {len(logprobs)} "
                f"log-probs ({len(versions or token_ids)} weight versions)"
            )
        self._append(list(token_ids), 1, [float(x) for x in logprobs], weight_version)
        ends_on_stop = bool(token_ids) and token_ids[-1] in self._special_ids
        body = list(token_ids[:-1]) if ends_on_stop else list(token_ids)
        content = self.decode(body)
        self._text_before_stop = len(self._text) + len(content) if ends_on_stop else None
        self._text += content + (self.decode([token_ids[-1]]) if ends_on_stop else "")
        self.messages.append({"role": "assistant", "content": content})
        self._turn_open = True
        return content

    def add_messages(self, new_messages: list[Message], max_total: int | None = None) -> bool:
        """Append the env's new messages plus the next generation prompt (loss_mask 0).

        Returns False, appending nothing, when the tokens would exceed ``max_total``.
        Raises :class:`TemplateError` only with ``on_template_mismatch="error"``.

        Example:
            >>> from transformers import AutoTokenizer
            >>> from vime.models.tiny import build_tiny_model
            >>> tok = AutoTokenizer.from_pretrained(build_tiny_model())
            >>> chat = ChatTokens(tok, [{"role": "user", "content": "Hi"}])
            >>> _ = chat.add_sampled([tok.eos_token_id], [-0.1])  # an empty assistant turn
            >>> chat.add_messages([{"role": "tool", "content": "42"}], max_total=len(chat.tokens))
            False
            >>> chat.add_messages([{"role": "tool", "content": "42"}])
            True
            >>> chat.mismatches  # the tiny template is append-only
            []
        """
        suffix = self._suffix(new_messages, add_generation_prompt=True)
        if suffix is not None:
            ids, text = suffix
            if max_total is not None and len(self.tokens) + len(ids) > max_total:
                return False
            self._append(ids, 0, None, -1)
            self._text = text
        self.messages.extend(dict(m) for m in new_messages)
        self._turn_open = False
        self._text_before_stop = None
        return True

    def close(self) -> None:
        """End the sequence after the last policy turn with the template's end-of-turn glue.

        Afterwards the tokens decode to ``render(messages, add_generation_prompt=False)``
        (for an append-only template). Does nothing if the last turn was already closed.

        Example:
            >>> from transformers import AutoTokenizer
            >>> from vime.models.tiny import build_tiny_model
            >>> tok = AutoTokenizer.from_pretrained(build_tiny_model())
            >>> chat = ChatTokens(tok, [{"role": "user", "content": "Hi"}])
            >>> ids = tok.encode("Hey")  # a turn cut before its <|im_end|> (max_tokens)
            >>> _ = chat.add_sampled(ids, [-0.1] * len(ids))
            >>> chat.close()
            >>> tok.decode(chat.tokens) == chat.render(chat.messages, add_generation_prompt=False)
            True
        """
        if not self._turn_open:
            return
        suffix = self._suffix([], add_generation_prompt=False)
        if suffix is not None:
            ids, text = suffix
            self._append(ids, 0, None, -1)
            self._text = text
        self._turn_open = False
        self._text_before_stop = None

    @property
    def request(self) -> list[int]:
        """The ids the next turn is sampled from: here, every token so far.

        Example:
            >>> from transformers import AutoTokenizer
            >>> from vime.models.tiny import build_tiny_model
            >>> chat = ChatTokens(AutoTokenizer.from_pretrained(build_tiny_model()), [{"role": "user", "content": "Hi"}])
            >>> chat.request == chat.tokens
            True
        """
        return self.tokens

    @property
    def text(self) -> str:
        """The conversation as text, in template space (what the tokens decode to)."""
        return self._text

    # ------------------------------------------------------------------ the prefix check

    def _suffix(
        self, new_messages: list[Message], add_generation_prompt: bool
    ) -> tuple[list[int], str] | None:
        """(ids to append, the full text afterwards) for ``new_messages``.

        None when ``restart_context`` has already replaced the tokens.
        """
        if self._delta_mode:
            text = self._delta_text(new_messages, add_generation_prompt)
            return self.encode(text), self._text + text
        full = self.render(self.messages + list(new_messages), add_generation_prompt)
        if full.startswith(self._text):
            return self.encode(full[len(self._text) :]), full
        stop_at = self._text_before_stop
        if stop_at is not None and full.startswith(self._text[:stop_at]):
            # The turn ended on a special token other than the template's own end-of-turn
            # token: it stands in for the template's token, which is not added again.
            rest = full[stop_at:]
            end_token = next((s for s in self._special_texts if rest.startswith(s)), None)
            if end_token is not None:
                self.stop_substitutions += 1
                return self.encode(rest[len(end_token) :]), full
        return self._mismatch(full, new_messages, add_generation_prompt)

    def _mismatch(
        self, full: str, new_messages: list[Message], add_generation_prompt: bool
    ) -> tuple[list[int], str] | None:
        at = _first_difference(full, self._text)
        err = TemplateError(
            f"env {self.env_id!r}: the chat template is not append-only: the conversation "
            f"so far is not a prefix of its re-render (first difference at char {at}: "
            f"tokens hold {self._text[at : at + 40]!r}, the template now renders "
            f"{full[at : at + 40]!r}). Typical causes: the template strips earlier <think> "
            "blocks, merges consecutive tool messages, or adds a date. Fix the template, or "
            "choose collector.on_template_mismatch (keep_history | restart_context | error)."
        )
        self.mismatches.append(str(err))
        if len(self.mismatches) == 1:
            logger.warning("%s", err)
        if self.on_template_mismatch == "error":
            raise err
        if self.on_template_mismatch == "restart_context":
            ids = self.encode(full)
            self.tokens, self.loss_mask = ids, [0] * len(ids)
            self.logprobs, self.weight_versions = [0.0] * len(ids), [-1] * len(ids)
            self._text = full
            return None
        self._delta_mode = True
        text = self._delta_text(new_messages, add_generation_prompt)
        return self.encode(text), self._text + text

    def _delta_text(self, new_messages: list[Message], add_generation_prompt: bool) -> str:
        """Glue + ``new_messages`` as rendered after a fixed base conversation.

        The base conversation keeps the first system message (so that the template's
        system/tools block is identical in both renders) and one neutral user/assistant
        exchange; the text the template adds after it is what follows an assistant turn.
        """
        head = [self.messages[0]] if self.messages and self.messages[0]["role"] == "system" else []
        base = [*head, {"role": "user", "content": _MARK}, {"role": "assistant", "content": _MARK}]
        r_base = self.render(base, add_generation_prompt=False)
        r_full = self.render(base + list(new_messages), add_generation_prompt)
        if not r_full.startswith(r_base) or _MARK not in r_base:
            raise TemplateError(
                f"env {self.env_id!r}: the chat template is not append-only even for a fixed "
                "base conversation; cannot tokenize new messages without re-tokenizing history. "
                "Fix the template or use collector.on_template_mismatch=restart_context."
            )
        glue = r_base[r_base.rindex(_MARK) + len(_MARK) :]  # e.g. "<|im_end|>\n"
        if self._text_before_stop is not None:
            # The sampled turn already holds its own end-of-turn token: skip the template's.
            end_token = next((s for s in self._special_texts if glue.startswith(s)), "")
            glue = glue[len(end_token) :]
        return glue + r_full[len(r_base) :]


def _first_difference(a: str, b: str) -> int:
    """Index of the first character where ``a`` and ``b`` differ."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
