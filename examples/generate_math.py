"""A per-sample generation function (docs/extend.md): one answer per task, graded by the env."""

import asyncio

from vime.types import Action


async def generate(ctx):
    env = ctx.make_env()  # a fresh env of the run's env.id (vime/Math-v0): it grades
    try:
        messages, _ = await asyncio.to_thread(env.reset, options={"task": ctx.task})
        chat = ctx.chat(messages)  # the prompt's ids, rendered once
        out = await ctx.policy.generate(chat.request)  # ids in, the engine's ids out
        text = chat.add_sampled(out.token_ids, out.logprobs, out.versions)
        _, reward, *_ = await asyncio.to_thread(env.step, Action(text=text))
    finally:
        env.close()
    return ctx.episode(chat, reward=reward)
