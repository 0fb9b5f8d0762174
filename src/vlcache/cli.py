"""The `vlcache` command line: one sub-command per job, each imported only when it is used."""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, help); each module exposes `add_arguments(parser)` and `run(args) -> int`.
COMMANDS: dict[str, tuple[str, str]] = {
    "generate": ("vlcache.commands.generate", "answer prompts about images through the cache"),
    "serve": ("vlcache.commands.serve", "OpenAI-compatible HTTP server with the image cache"),
    "profile": ("vlcache.commands.profile", "measure layer sensitivity and write a recompute plan"),
    "eval": ("vlcache.commands.evaluate", "compare reuse policies against full recompute"),
    "report": ("vlcache.commands.report", "rewrite an evaluation's summary from its rows.csv"),
    "bench": ("vlcache.commands.bench", "time-to-first-token side by side; server load run"),
}


def build_parser(command: str | None) -> argparse.ArgumentParser:
    """The full parser for `command`; the other sub-commands are listed but not imported."""
    parser = argparse.ArgumentParser(prog="vlcache", description="vlcache: reuse image KV "
                                     "caches at any position in a prompt.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == command:
            importlib.import_module(module).add_arguments(p)
            p.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)
    if command == "fixture":  # a command of its own since the fixture left the package
        print("vlcache: the fixture has its own command now: vlcache-fixture "
              + " ".join(argv[argv.index("fixture") + 1:]), file=sys.stderr)
        return 2
    args = build_parser(command if command in COMMANDS else None).parse_args(argv)
    return int(importlib.import_module(args._module).run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
