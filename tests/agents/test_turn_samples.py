"""Per-turn samples without an engine: scripted turns on the real tiny tokenizer with the
bundled Qwen3-format template, the split in make_samples, and the config keys."""

from __future__ import annotations

import pytest

from vime.agents import CollectorConfig
from vime.agents.chat_tokens import ChatTokens
from vime.agents.turn_samples import TurnChatTokens, sample_spans, turn_samples
from vime.conf.compose import load_config
from vime.errors import ConfigError, TemplateError
from vime.models.templates import BUNDLED, load_chat_template, with_chat_template
from vime.models.tiny import IM_END_ID
from vime.rl.advantages import make_samples
from vime.types import Episode

OPENING = [{"role": "user", "content": "What is 1+2?"}]
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
THINK_CALL = f"<think>\nI add them.\n</think>\n\n{CALL}"
THINK_ANSWER = "<think>\nIt is 3.\n</think>\n\nThe answer is 3."


@pytest.fixture(scope="module")
def tok(tiny_model_dir, tmp_path_factory):
    from transformers import AutoTokenizer

    folder = with_chat_template(tiny_model_dir, "qwen3", tmp_path_factory.mktemp("tpl"))
    return AutoTokenizer.from_pretrained(folder)


def ids(tok, text: str) -> list[int]:
    return [*tok.encode(text, add_special_tokens=False), IM_END_ID]


def spelled(tok, text: str) -> list[int]:
    """``text`` one character at a time: ids a policy may sample, not the canonical ones."""
    return [*(i for ch in text for i in tok.encode(ch, add_special_tokens=False)), IM_END_ID]


def play(tok, turns: list[list[int]], answers: list[list[dict]]) -> TurnChatTokens:
    chat = TurnChatTokens(tok, OPENING, env_id="test/Think-v0")
    for k, turn in enumerate(turns):
        chat.add_sampled(turn, [-0.25] * len(turn), weight_version=k)
        if k < len(answers):
            assert chat.add_messages(answers[k])
    chat.close()
    return chat


def request_of(tok, messages: list[dict]) -> list[int]:
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tok.encode(text, add_special_tokens=False)


def test_a_tool_chain_stays_one_sample_and_a_new_question_starts_another(tok) -> None:
    t1, t2, t3 = ids(tok, THINK_CALL), ids(tok, THINK_ANSWER), ids(tok, "Yes.")
    tool = [{"role": "tool", "content": "3"}]
    chat = play(tok, [t1, t2, t3], [tool, [{"role": "user", "content": "Sure?"}]])
    # Qwen3 keeps the thought inside a tool chain: turn 2 extends turn 1's sample. The new
    # question drops both thoughts: turn 3 is a sample of its own.
    assert chat.merged_turns == 1 and len(chat.sample_starts) == 2
    first, second = (
        chat.tokens[a:b]
        for a, b in zip(
            chat.sample_starts, [*chat.sample_starts[1:], len(chat.tokens)], strict=True
        )
    )
    assert second == request_of(tok, chat.messages[:-1]) + t3
    assert first == request_of(tok, chat.messages[:3]) + t2
    assert "<think>" not in tok.decode(second[: -len(t3)])
    mask = chat.loss_mask[: len(first)]
    assert [t for t, m in zip(first, mask, strict=True) if m] == t1 + t2
    tool_start = first.index(tok.convert_tokens_to_ids("<tool_response>"))
    assert mask[tool_start - 3 : tool_start + 4] == [0] * 7  # glue and tool output: context
    # The same conversation through ChatTokens: the rewrite is a mismatch there, and even
    # keep_history's fixed base conversation is rewritten (Qwen3 shows an empty thought on
    # a last assistant turn only), so only restart_context (nothing trained) goes on.
    sure = [{"role": "user", "content": "Sure?"}]
    for mode in ("keep_history", "restart_context"):
        flat = ChatTokens(tok, OPENING, env_id="test/Think-v0", on_template_mismatch=mode)
        flat.add_sampled(t1, [-0.25] * len(t1))
        flat.add_messages(tool)
        flat.add_sampled(t2, [-0.25] * len(t2))
        if mode == "keep_history":
            with pytest.raises(TemplateError, match="not append-only even for a fixed base"):
                flat.add_messages(sure)
            continue
        flat.add_messages(sure)
        assert len(flat.mismatches) == 1 and sum(flat.loss_mask) == 0
    assert chat.mismatches == []


def test_ids_the_template_would_spell_otherwise_start_a_new_sample(tok) -> None:
    t1, t2 = spelled(tok, THINK_CALL), ids(tok, THINK_ANSWER)
    chat = play(tok, [t1, t2], [[{"role": "tool", "content": "3"}]])
    # The render of turn 1 re-tokenizes it: the request is what the model sees at inference,
    # so turn 1's sample keeps its own ids and turn 2 gets a sample of its own.
    assert chat.merged_turns == 0 and len(chat.sample_starts) == 2
    ep = Episode(
        "t",
        "e",
        chat.tokens,
        chat.loss_mask,
        chat.logprobs,
        reward=1.0,
        weight_versions=chat.weight_versions,
        sample_starts=chat.sample_starts,
    )
    samples, owner = turn_samples([ep])
    assert owner == [0, 0]
    assert [[t for t, m in zip(s.tokens, s.loss_mask, strict=True) if m] for s in samples] == [
        t1,
        t2,
    ]
    assert samples[0].tokens == request_of(tok, OPENING) + t1
    assert samples[1].tokens == request_of(tok, chat.messages[:3]) + t2
    assert [s.weight_version for s in samples] == [0, 1]


def test_budget_counts_the_request_not_the_episode(tok) -> None:
    chat = TurnChatTokens(tok, OPENING)
    turn = spelled(tok, THINK_CALL)
    chat.add_sampled(turn, [-0.1] * len(turn))
    n = len(chat.tokens)
    need = len(
        request_of(
            tok,
            [
                *OPENING,
                {"role": "assistant", "content": THINK_CALL},
                {"role": "tool", "content": "3"},
            ],
        )
    )
    assert not chat.add_messages([{"role": "tool", "content": "3"}], max_total=need - 1)
    assert len(chat.tokens) == n
    assert chat.add_messages([{"role": "tool", "content": "3"}], max_total=need)
    assert len(chat.request) == need


def episode(
    reward: float, group: str, spans: list[tuple[int, int]], status="completed", reason=""
) -> Episode:
    """An episode of ``spans`` (context, sampled) token counts, one sample per span."""
    tokens, mask, starts = [], [], []
    for ctx, out in spans:
        starts.append(len(tokens))
        tokens += list(range(3, 3 + ctx + out))
        mask += [0] * ctx + [1] * out
    lps = [-0.5 * m for m in mask]
    return Episode(
        "t",
        "e",
        tokens,
        mask,
        lps,
        reward=reward,
        group_id=group,
        status=status,
        reason=reason,
        sample_starts=starts,
    )


def test_make_samples_gives_every_turn_its_episodes_advantage_and_group() -> None:
    eps = [
        episode(1.0, "g", [(4, 2), (6, 3)]),
        episode(0.0, "g", [(4, 5)]),
        episode(1.0, "h", [(3, 1), (5, 1), (7, 1)]),
        episode(1.0, "h", [(3, 2)]),
    ]
    cfg = load_config(["rollout.filter_groups=false", "algorithm.advantage=rloo"])
    samples, stats = make_samples(eps, cfg, version=0)
    assert [len(s.tokens) for s in samples] == [6, 9, 9, 4, 6, 8, 5]
    # RLOO over episodes (a group of 2: ±1 or 0), whatever each episode's number of samples.
    assert [s.advantage for s in samples] == [1.0, 1.0, -1.0, 0.0, 0.0, 0.0, 0.0]
    assert [s.group_id for s in samples] == ["g", "g", "g", "h", "h", "h", "h"]
    assert stats["samples/trained"] == 7.0

    # A KL reward penalty sums over the episode's samples; the over-long mask drops them all.
    def ref(samples):
        return [
            [lp - 0.1 * m for lp, m in zip(s.rollout_logprobs, s.loss_mask, strict=True)]
            for s in samples
        ]

    cfg = load_config(
        [
            "rollout.filter_groups=false",
            "algorithm.kl_reward_coef=1.0",
            "trainer.loss.kl_estimator=k1",
        ]
    )
    samples, _ = make_samples(eps[:2], cfg, version=0, reference=ref)
    assert [round(s.reward, 6) for s in samples] == [0.5, 0.5, -0.5]
    long = episode(1.0, "g", [(4, 2), (6, 3)], status="truncated", reason="max_tokens")
    cfg = load_config(["rollout.filter_groups=false", "algorithm.overlong=mask"])
    samples, _ = make_samples([long, eps[1]], cfg, version=0)
    assert [len(s.tokens) for s in samples] == [9]


def test_episodes_of_one_sample_are_unchanged() -> None:
    ep = Episode("t", "e", [5, 6, 7], [0, 1, 1], [0.0, -1.0, -1.0], sample_starts=[0])
    assert sample_spans(ep) == [(0, 3)]
    (s,), _ = turn_samples([ep])
    assert s.tokens == [5, 6, 7] and "turn_sample" not in s.metadata
    with pytest.raises(ValueError, match="sample_starts"):
        Episode("t", "e", [5, 6], [0, 1], [0.0, -1.0], sample_starts=[2])


def test_config_keys_name_themselves(tmp_path, tiny_model_dir) -> None:
    with pytest.raises(ConfigError, match=r"collector\.on_template_mismatch") as err:
        CollectorConfig(sample_per_turn=True, on_template_mismatch="error")
    assert err.value.key == "collector.on_template_mismatch"
    assert load_config(["rollout.collector.sample_per_turn=true"]).rollout.collector.sample_per_turn
    with pytest.raises(ConfigError, match=r"model\.chat_template.*qwen3") as err:
        load_config(["model.chat_template=qwen2"])
    assert err.value.key == "model.chat_template"
    plain = tmp_path / "plain.txt"
    plain.write_text("no jinja here")
    with pytest.raises(ConfigError, match="holds no Jinja"):
        load_config([f"model.chat_template={plain}"])
    mine = tmp_path / "mine.jinja"
    mine.write_text(load_chat_template("qwen3"))
    assert load_config([f"model.chat_template={mine}"]).model.chat_template == str(mine)
    for name in BUNDLED:
        folder = with_chat_template(tiny_model_dir, name, tmp_path / "cache")
        assert (folder / "model.safetensors").resolve() == (
            tiny_model_dir / "model.safetensors"
        ).resolve()
        assert with_chat_template(tiny_model_dir, name, tmp_path / "cache") == folder


def test_vllm_renders_with_the_folders_template(tiny_model_dir, tmp_path) -> None:
    """vLLM loads the templated folder's tokenizer (its chat endpoint renders with it)."""
    from transformers import AutoTokenizer
    from vllm.tokenizers.registry import get_tokenizer

    folder = with_chat_template(tiny_model_dir, "qwen3", tmp_path)
    theirs, ours = get_tokenizer(str(folder)), AutoTokenizer.from_pretrained(folder)
    assert theirs.get_chat_template(None, tools=None) == load_chat_template("qwen3")
    messages = [
        *OPENING,
        {"role": "assistant", "content": THINK_CALL},
        {"role": "user", "content": "Sure?"},
    ]
    args = {"tokenize": False, "add_generation_prompt": True}
    assert theirs.apply_chat_template(messages, **args) == ours.apply_chat_template(
        messages, **args
    )
    assert "<think>" not in theirs.apply_chat_template(messages, **args)
