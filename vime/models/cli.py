"""``vime-agent model``: build the tiny local model.

Example:
    $ vime-agent model tiny --out /tmp/tiny
    tiny model: 804,480 parameters, vocab 512, qwen2 (hidden 128, 3 layers), float32
    /tmp/tiny
"""

from __future__ import annotations

import argparse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vime-agent model", description="Build or inspect models."
    )
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    tiny = sub.add_parser(
        "tiny",
        help="build the tiny local Qwen2 model + tokenizer (cached); prints its folder last",
    )
    tiny.add_argument("--out", default=None, help="also place the model in this folder")
    tiny.add_argument("--force", action="store_true", help="rebuild even if a cached build exists")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``vime-agent model ...``; the last line of stdout is the model folder."""
    args = build_parser().parse_args(argv)
    if args.action == "tiny":
        from vime.models.tiny import TinyModelSpec, build_tiny_model, count_parameters

        spec = TinyModelSpec()
        path = build_tiny_model(args.out, spec, force=args.force)
        print(
            f"tiny model: {count_parameters(spec):,} parameters, vocab {spec.vocab_size}, "
            f"qwen2 (hidden {spec.hidden_size}, {spec.num_layers} layers), float32"
        )
        print(path)
    return 0
