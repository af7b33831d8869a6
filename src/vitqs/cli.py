"""The ``vitqs`` command line: parses arguments and calls ``run``; nothing else lives here."""

from __future__ import annotations

import argparse
import json
import sys

from vitqs import __version__
from vitqs.config import ConfigError, load


def _add_config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="YAML config file")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one key by its dotted path, value parsed as YAML (repeatable)",
    )
    parser.add_argument("--json", action="store_true", help="end stdout with one JSON line")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vitqs", description=__doc__)
    parser.add_argument("--version", action="version", version=f"vitqs {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    ed = commands.add_parser("ed", help="exact ground-state energy of a config's Hamiltonian")
    _add_config_arguments(ed)
    ed.add_argument("--no-cache", action="store_true", help="solve again, ignoring the ED cache")
    return parser


def _cmd_ed(args) -> int:
    from vitqs.run import run_exact

    config = load(args.config, args.overrides)
    summary = run_exact(config, use_cache=not args.no_cache)
    ham = config.hamiltonian
    print(f"{config.name}: {ham.kind} on {config.lattice.shape} (pbc={config.lattice.pbc})")
    print(f"  energy           {summary['energy']:.12f}")
    print(f"  energy per site  {summary['energy_per_site']:.12f}")
    print(f"  dimension        {summary['dimension']}")
    cached = " (from cache)" if summary["cached"] else ""
    print(f"  seconds          {summary['seconds']:.3f}{cached}")
    if args.json:
        print(json.dumps(summary))
    return 0


_COMMANDS = {"ed": _cmd_ed}


def main(argv: list[str] | None = None) -> int:
    """Runs one ``vitqs`` command; returns the exit code (2 for bad input)."""
    args = _parser().parse_args(argv)
    try:
        return _COMMANDS[args.command](args)
    except ConfigError as err:
        print(f"vitqs {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"vitqs {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
