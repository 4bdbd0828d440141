"""A rollout orchestrator (docs/extend.md): each step plays one group at a time until
``batch_size`` groups carry signal, instead of vime's rounds of a whole batch."""

from vime.rl.orchestrator import Orchestrator


class UntilFull(Orchestrator):
    async def take(self, version):
        ctx, groups = self.ctx, []
        signal = 0
        while signal < ctx.rollout.batch_size and not self.stopping:
            (group,) = await ctx.play([ctx.lend()])  # one task, its n_samples episodes
            groups.append(group)  # every lent task is returned, with or without signal
            signal += group.has_signal(ctx.signal, version)
        return groups


def until_full(ctx):
    return UntilFull(ctx)
