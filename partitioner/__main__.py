"""`python -m partitioner --examples` prints the plan tables of docs/partitioning.md."""

from __future__ import annotations

import argparse

from .examples import EXAMPLES, LINK_EXAMPLES
from .markdown import render_examples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m partitioner", description=__doc__)
    parser.add_argument("--examples", action="store_true", help="print plans for realistic swarms as markdown")
    args = parser.parse_args(argv)
    if not args.examples:
        parser.print_help()
        return 2
    print(render_examples(EXAMPLES + LINK_EXAMPLES), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
