"""``vime-agent envs`` and ``vime-agent check-env``.

Example:
    $ vime-agent envs
    $ vime-agent check-env vime/Math-v0 --action '\\boxed{4}'
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from vime.envs.registration import registry
from vime.errors import EnvError


def list_main(argv: list[str]) -> int:
    """Print a table of registered env ids, entry points, turn limits and defaults.

    Example:
        >>> list_main([])  # doctest: +ELLIPSIS
        id ...
    """
    parser = argparse.ArgumentParser(
        prog="vime-agent envs", description="list registered environments"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object per env")
    args = parser.parse_args(argv)
    specs = list(registry.values())  # listing imports no env code
    if args.json:
        for spec in specs:
            row = {"id": spec.id, "entry_point": spec.entry_point_name, "max_turns": spec.max_turns}
            print(json.dumps({**row, "defaults": spec.defaults}, default=str))
        return 0
    table = [["id", "entry_point", "max_turns", "defaults"]]
    for spec in specs:
        table.append(
            [
                spec.id,
                spec.entry_point_name,
                "-" if spec.max_turns is None else str(spec.max_turns),
                " ".join(f"{k}={v!r}" for k, v in spec.defaults.items()) or "-",
            ]
        )
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    for r in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
    return 0


def check_main(argv: list[str]) -> int:
    """Run ``check_env`` on a registered env with a scripted action; exit 1 if a check fails.

    Example:
        $ vime-agent check-env vime/Math-v0 --action '\\boxed{4}' env.level=add1
    """
    from vime.envs.checker import run_checks
    from vime.envs.registration import make

    parser = argparse.ArgumentParser(
        prog="vime-agent check-env",
        description="check a registered env against the vime.Env contract",
    )
    parser.add_argument("id", help="registered env id, e.g. vime/Math-v0")
    parser.add_argument("--action", default="42", help="the scripted assistant text (default: 42)")
    parser.add_argument(
        "--task", default=None, help="one task record as JSON (default: the env's own)"
    )
    parser.add_argument("--seed", type=int, default=123)
    parser.add_argument("kwargs", nargs="*", help="env options as key=value (e.g. level=add1)")
    args = parser.parse_intermixed_args(argv)
    try:
        kwargs = _parse_kwargs(args.kwargs)
        task = None if args.task is None else _parse_task(args.task)
    except EnvError as err:
        print(err, file=sys.stderr)
        return 2
    try:
        env = make(args.id, **kwargs)
    except EnvError as err:
        print(f"FAIL  make({args.id!r}): {err}")
        return 1
    try:
        results = run_checks(env, action=args.action, task=task, seed=args.seed)
    finally:
        try:
            env.close()
        except EnvError as err:
            print(f"FAIL  close(): {err}")
    width = max(len(r.name) for r in results)
    for r in results:
        print(f"{'ok  ' if r.ok else 'FAIL'}  {r.name.ljust(width)}  {r.message}".rstrip())
    failed = sum(not r.ok for r in results)
    print(f"{env.env_id}: {len(results) - failed}/{len(results)} checks passed")
    return 1 if failed else 0


def _parse_kwargs(items: list[str]) -> dict[str, Any]:
    from vime.config import parse_value

    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise EnvError(f"env option {item[:80]!r} is not key=value (example: level=add1)")
        out[key.removeprefix("env.")] = parse_value(raw)
    return out


def _parse_task(text: str) -> dict[str, Any]:
    """The ``--task`` record: one JSON object, or an EnvError saying what is wrong."""
    try:
        task = json.loads(text)
    except json.JSONDecodeError as err:
        raise EnvError(f"--task is not valid JSON: {err}") from None
    except (ValueError, RecursionError) as err:  # 4300+ digit integers, deep nesting
        raise EnvError(f"--task cannot be read: {type(err).__name__}: {str(err)[:120]}") from None
    if not isinstance(task, dict):
        raise EnvError(
            f'--task must be one JSON object like {{"id": "t1", ...}}, got {type(task).__name__}'
        )
    return task
