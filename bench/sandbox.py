"""Sandbox benchmark: each figure is printed next to its baseline, measured in the same run.

1. Pool ``acquire`` p50/p95 vs a cold ``containers.run`` (target: acquire >= 10x faster).
2. ``DockerSandbox.exec`` vs the raw docker-SDK ``exec_run`` on the same container
   (target: <= 1.1x).
3. Episodes per minute for a 5-exec episode (acquire, 5 commands, release with reset) at
   1, 8 and 32 concurrent sandboxes.
4. How far past its limit a timed-out ``exec`` returns (the process tree is killed).
5. vime/SWE-v0 as envs run it: episode start (``reset`` + the first ``bash`` call: the
   lease, the repository set up, the command) with pooled sandboxes (the default) vs a
   cold container per episode (``sandbox.pool=false``), and whole SWE episodes per
   minute (start, run the tests, apply the fix, submit, graded by the hidden tests in a
   second sandbox) at 1, 8 and 32 concurrent episodes, pooled.

Usage (dockerd from scripts/dockerd.sh; the base image is built if missing):

    DOCKER_HOST=$(bash scripts/dockerd.sh start) .venv/bin/python bench/sandbox.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import vime
from vime.sandbox import DockerSandbox, SandboxConfig, SandboxPool, build_base_image
from vime.sandbox.client import docker_client
from vime.sandbox.leases import close_pools
from vime.types import Action, ToolCall

RUN_ID = "bench-sandbox"
EPISODE = [
    "echo start > /workspace/log",
    "ls -la /workspace",
    "python3 -c 'print(sum(range(1000)))'",
    "cat /workspace/log",
    "wc -c /workspace/log",
]


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of ``values``, nearest rank."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def ms(x: float) -> str:
    return f"{x * 1000:7.1f} ms" if x >= 0.001 else f"{x * 1e6:7.1f} µs"


def bench_acquire(cfg: SandboxConfig, n_cold: int, n_acquire: int) -> None:
    client = docker_client(cfg.hosts()[0])
    cold = []
    for _ in range(n_cold):
        t0 = time.perf_counter()
        c = client.containers.run(
            cfg.image,
            ["sleep", "infinity"],
            detach=True,
            network_mode="none",
            labels={"vime.sandbox": "1", "vime.run": RUN_ID},
        )
        cold.append(time.perf_counter() - t0)
        c.remove(force=True)
    sandbox_cold = []
    for _ in range(max(3, n_cold // 2)):
        t0 = time.perf_counter()
        DockerSandbox(cfg).close()
        sandbox_cold.append(time.perf_counter() - t0)
    with SandboxPool(cfg, size=4) as pool:
        pool.wait_ready(120)
        lat = []
        for _ in range(n_acquire):
            t0 = time.perf_counter()
            sb = pool.acquire(timeout=60)
            lat.append(time.perf_counter() - t0)
            sb.exec("true", timeout=10)  # a minimal episode, so the reset has work to overlap
            pool.release(sb)
    p50, p95 = pct(lat, 0.5), pct(lat, 0.95)
    cold50 = statistics.median(cold)
    print("1. acquire vs cold start")
    print(
        f"   cold containers.run        p50 {ms(cold50)}  p95 {ms(pct(cold, 0.95))}  (n={n_cold})"
    )
    print(
        f"   cold DockerSandbox()       p50 {ms(statistics.median(sandbox_cold))}  (create+start, locked down)"
    )
    print(
        f"   pool.acquire (size 4)      p50 {ms(p50)}  p95 {ms(p95)}  (n={n_acquire}, release resets)"
    )
    print(
        f"   => acquire p50 is {cold50 / p50:,.0f}x faster than a cold start (p95: {cold50 / p95:,.0f}x); target >= 10x"
    )


def bench_exec(cfg: SandboxConfig, n: int) -> None:
    with DockerSandbox(cfg) as sb:
        container = docker_client(sb.host).containers.get(sb.id)
        rows = []
        for argv in (["true"], ["python3", "-c", "print(1)"]):
            raw, ours = [], []
            for _ in range(3):  # warm both paths
                container.exec_run(argv, user=cfg.user)
                sb.exec(argv, timeout=30)
            for _ in range(n):  # interleaved, so drift in machine load hits both alike
                t0 = time.perf_counter()
                code, _ = container.exec_run(argv, user=cfg.user)
                raw.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                res = sb.exec(argv, timeout=30)
                ours.append(time.perf_counter() - t0)
                assert code == 0 and res.exit_code == 0
            rows.append((" ".join(argv), statistics.median(raw), statistics.median(ours)))
    print("2. exec overhead vs raw docker-SDK exec_run (same container, medians)")
    for name, r, o in rows:
        print(f"   {name:28s} raw {ms(r)}  vime {ms(o)}  => {o / r:.2f}x (target <= 1.1x)")


def bench_episodes(cfg: SandboxConfig, levels: list[int], episodes_per_slot: int) -> None:
    print(f"3. episodes/minute, one episode = acquire + {len(EPISODE)} execs + release(reset)")
    for conc in levels:
        with SandboxPool(cfg, size=conc) as pool:
            t0 = time.perf_counter()
            pool.wait_ready(300)
            warm = time.perf_counter() - t0

            def episode(_: int) -> None:
                with pool.session(timeout=120) as sb:
                    for cmd in EPISODE:
                        res = sb.exec(cmd, timeout=30)
                        assert res.exit_code == 0, res

            total = max(12, conc * episodes_per_slot)
            t0 = time.perf_counter()
            with ThreadPoolExecutor(max_workers=conc) as ex:
                list(ex.map(episode, range(total)))
            wall = time.perf_counter() - t0
        print(
            f"   {conc:3d} concurrent: {total / wall * 60:8.0f} episodes/min  ({total} episodes in {wall:.1f} s; pool warm-up {warm:.1f} s)"
        )


def bench_timeout(cfg: SandboxConfig, n: int, limit: float = 0.5) -> None:
    over = []
    with DockerSandbox(cfg) as sb:
        for _ in range(n):
            t0 = time.perf_counter()
            res = sb.exec("sleep 60 & sleep 60", timeout=limit)
            over.append(time.perf_counter() - t0 - limit)
            assert res.timed_out
    print(
        f"4. timeout overshoot (limit {limit} s, tree killed): p50 {ms(statistics.median(over))}  max {ms(max(over))}  (n={n})"
    )


def _swe_episode(env: object, task: dict, seed: int, full: bool) -> float:
    """Play one SWE episode with fixed actions; returns the start time (reset + first
    call). With ``full`` it also runs the tests, applies the task's fix and submits."""

    def act(*calls: ToolCall) -> Action:
        return Action(text="", tool_calls=list(calls))

    t0 = time.perf_counter()
    env.reset(seed=seed, options={"task": task})  # type: ignore[attr-defined]
    out = env.step(act(ToolCall("bash", {"command": "ls"})))  # type: ignore[attr-defined]
    start = time.perf_counter() - t0
    assert out[0][0]["content"].startswith("exit code 0"), out[0][0]["content"][:300]
    if full:
        env.step(act(ToolCall("bash", {"command": "python3 -m unittest -q 2>&1 | tail -1"})))  # type: ignore[attr-defined]
        fix = [
            ToolCall("str_replace", {"path": p, "old_str": o, "new_str": n})
            for p, o, n in task["solution"]
        ]
        env.step(act(*fix))  # type: ignore[attr-defined]
        reward = env.step(act(ToolCall("submit", {})))[1]  # type: ignore[attr-defined]
        assert reward == 1.0, f"{task['id']}: the fix was not graded 1"
    env.close()  # type: ignore[attr-defined]
    return start


def bench_swe(cfg: SandboxConfig, levels: list[int], n_start: int) -> None:
    from vime.suites.swe.tasks import load_bundled

    tasks = load_bundled()
    swe_cfg = dict(memory="512m", timeout=60.0, env={"HOME": "/tmp"}, run_id=RUN_ID)
    starts: dict[bool, list[float]] = {}
    for pooled in (False, True):
        sandbox = SandboxConfig(image=cfg.image, pool=pooled, **swe_cfg)  # type: ignore[arg-type]
        env = vime.make("vime/SWE-v0", sandbox=sandbox)
        _swe_episode(env, tasks[0], 0, full=False)  # warm: the pool starts, caches fill
        starts[pooled] = [
            _swe_episode(env, tasks[i % len(tasks)], i, full=False) for i in range(n_start)
        ]
    close_pools()
    cold, warm = statistics.median(starts[False]), statistics.median(starts[True])
    print("5. vime/SWE-v0 (bundled tasks), pooled sandboxes vs a cold container per episode")
    print(
        f"   episode start (reset + first bash call), medians of {n_start}: cold {ms(cold)}  "
        f"pooled {ms(warm)}  => {cold / warm:.1f}x faster pooled"
    )
    for conc in levels:
        sandbox = SandboxConfig(image=cfg.image, pool_max=2 * conc, **swe_cfg)  # type: ignore[arg-type]
        # Untimed: the pool starts (grows to this concurrency) and the repository caches fill.
        _swe_round(sandbox, tasks, conc, conc, full=False)
        total = max(8, conc)
        t0 = time.perf_counter()
        _swe_round(sandbox, tasks, total, conc, full=True)
        wall = time.perf_counter() - t0
        close_pools()
        print(
            f"   {conc:3d} concurrent: {total / wall * 60:8.1f} SWE episodes/min  "
            f"({total} graded episodes in {wall:.1f} s)"
        )


def _swe_round(sandbox: SandboxConfig, tasks: list, n: int, conc: int, full: bool) -> None:
    """``n`` SWE episodes, ``conc`` at a time, each with its own env."""

    def one(i: int) -> float:
        env = vime.make("vime/SWE-v0", sandbox=sandbox)
        return _swe_episode(env, tasks[i % len(tasks)], i, full=full)

    with ThreadPoolExecutor(max_workers=conc) as ex:
        list(ex.map(one, range(n)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cold", type=int, default=10, help="cold containers.run samples")
    parser.add_argument("--acquire", type=int, default=200, help="acquire samples")
    parser.add_argument("--exec", type=int, default=60, help="exec samples per command")
    parser.add_argument("--levels", default="1,8,32", help="concurrency levels")
    parser.add_argument("--episodes-per-slot", type=int, default=4)
    parser.add_argument("--swe-starts", type=int, default=10, help="SWE starts per mode")
    parser.add_argument("--only-swe", action="store_true", help="run section 5 alone")
    args = parser.parse_args(argv)
    cfg = SandboxConfig(image=build_base_image(), run_id=RUN_ID)
    print(f"image {cfg.image} on {cfg.hosts()[0]}")
    levels = [int(x) for x in args.levels.split(",")]
    if args.only_swe:
        bench_swe(cfg, levels, args.swe_starts)
        return 0
    bench_acquire(cfg, args.cold, args.acquire)
    bench_exec(cfg, args.exec)
    bench_episodes(cfg, levels, args.episodes_per_slot)
    bench_timeout(cfg, 15)
    bench_swe(cfg, levels, args.swe_starts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
