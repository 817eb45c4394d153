"""Command line: ``python -m cudagraph_kit env`` | ``reproduce [NAMES...] [--smoke] [--out DIR] [--results DIR]``
| ``lab``."""
from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cudagraph_kit", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("env", help="print the hardware/software environment")
    rep = sub.add_parser("reproduce", help="execute the notebooks headless (papermill); on a GPU this refreshes "
                                           "the recorded notebooks/*.ipynb and figures/")
    rep.add_argument("names", nargs="*", help="notebook name prefixes, e.g. 01 02 (default: all)")
    rep.add_argument("--smoke", action="store_true", help="small sizes; nothing recorded is touched (build/)")
    rep.add_argument("--out", default=None, help="folder for the executed notebooks")
    rep.add_argument("--results", default=None, help="folder for the notebooks' results (default: figures/ on "
                                                     "a GPU, build/figures otherwise)")
    lab = sub.add_parser("lab", help="open JupyterLab on working copies of the notebooks (build/lab)")
    lab.add_argument("--dir", default=None, help="folder for the working copies (default: build/lab)")
    args = parser.parse_args(argv)
    if args.command == "env":
        from .env import env_table
        print(env_table())
        return 0
    if args.command == "lab":
        from .course.reproduce import lab as open_lab
        open_lab(args.dir)
        return 0
    from .course.reproduce import reproduce
    reproduce(args.names, out_dir=args.out, smoke=args.smoke, results_dir=args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
