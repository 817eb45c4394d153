"""Command line: ``python -m cudagraph_kit env`` | ``reproduce [NAMES...] [--smoke] [--out DIR]``."""
from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cudagraph_kit", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("env", help="print the hardware/software environment")
    rep = sub.add_parser("reproduce", help="execute the notebooks headless (papermill) and refresh figures/")
    rep.add_argument("names", nargs="*", help="notebook name prefixes, e.g. 01 02 (default: all)")
    rep.add_argument("--smoke", action="store_true", help="small sizes; results go to build/, not figures/")
    rep.add_argument("--out", default=None, help="folder for the executed notebooks")
    args = parser.parse_args(argv)
    if args.command == "env":
        from .env import env_table
        print(env_table())
        return 0
    from .reproduce import reproduce
    reproduce(args.names, out_dir=args.out, smoke=args.smoke)
    return 0


if __name__ == "__main__":
    sys.exit(main())
