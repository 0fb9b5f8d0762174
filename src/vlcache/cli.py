"""The `vlcache` command line: one sub-command per job, each imported lazily."""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, help); each module exposes `add_arguments(parser)` and `run(args) -> int`.
COMMANDS: dict[str, tuple[str, str]] = {
    "generate": ("vlcache.commands.generate", "answer prompts about images through the cache"),
    "fixture": ("vlcache.fixture.cli", "build or train the trained fixture VLM"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vlcache", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        importlib.import_module(module).add_arguments(p)
        p.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(importlib.import_module(args._module).run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
