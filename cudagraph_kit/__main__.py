"""Command line of cudagraph-kit: python -m cudagraph_kit {env, reproduce, check-figures, lab} [options].

reproduce, check-figures and lab need a source checkout of the repository (git clone); env and --version work
wherever the kit is installed. python -m cudagraph_kit COMMAND --help describes each command.
"""
from __future__ import annotations

import argparse
import sys


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m cudagraph_kit", description=__doc__.strip(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    from . import __version__
    parser.add_argument("--version", action="version", version=f"cudagraph-kit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("env", help="print the GPU, driver, PyTorch, CUDA, CPU and Python of this machine")
    rep = sub.add_parser(
        "reproduce", help="execute the notebooks headless (papermill); on a GPU this refreshes the recorded "
                          "notebooks/*.ipynb and figures/ (for maintainers; --smoke leaves them alone)",
        description="Execute the notebooks headless. Each notebook runs into build/reproduce/<name>/ first; only "
                    "a notebook that finished without error is moved into place, its results folder replacing "
                    "the old one whole. A failed or interrupted notebook leaves the published files as they were. "
                    "Before each notebook it forecasts its time from a recorded run on the same kind of device; at "
                    "the end it prints a summary (each notebook, its time, where its outputs went, the failing "
                    "cell) and exits 1 if a notebook failed (130 if interrupted). Every cell is watched: far past "
                    "its recorded time its kernel's Python stacks go into the log, and further on the run stops it "
                    "and says which cell (STALLED in the summary).")
    rep.add_argument("names", nargs="*", help="notebook name prefixes, e.g. 01 02 (default: all)")
    rep.add_argument("--smoke", action="store_true", help="small sizes; nothing recorded is touched (build/)")
    rep.add_argument("--out", default=None, help="folder for the executed notebooks")
    rep.add_argument("--results", default=None, help="folder for the notebooks' results (default: figures/ on "
                                                     "a GPU, build/figures otherwise)")
    rep.add_argument("--resume", action="store_true",
                     help="go on with the run recorded in the results folder (same code, GPU and PyTorch), "
                          "skipping the notebooks it already published")
    chk = sub.add_parser("check-figures", help="say whether figures/ comes from one run (exit 1 if it mixes runs)")
    chk.add_argument("--figures", default=None, help="results folder to check (default: the recorded figures/)")
    lab = sub.add_parser("lab", help="open JupyterLab on working copies of the notebooks (build/lab); other "
                                     "options (--no-browser, --port 8889, --ip, ...) go to jupyter lab",
                         description="Open JupyterLab on working copies of the notebooks (build/lab). Options not "
                                     "listed here (--no-browser, --port 8889, --ip 0.0.0.0, ...) go to jupyter lab "
                                     "as they are; the exit status is JupyterLab's. Run as root (a container, "
                                     "Colab), it adds --allow-root, which JupyterLab otherwise demands before it "
                                     "starts, and says so.")
    lab.add_argument("--dir", default=None, help="folder for the working copies (default: build/lab)")
    return parser


def main(argv=None) -> int:
    parser = _parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and args.command != "lab":  # only lab passes options on (to jupyter lab)
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command == "env":
        from .env import env_table
        print(env_table())
        return 0
    if args.command == "lab":
        from .course.running.reproduce import lab as open_lab
        return open_lab(args.dir, extra_args=unknown)
    if args.command == "check-figures":
        from .course.running.paths import NOTEBOOKS_DIR, require_checkout
        from .course.running.runs import check_figures
        if args.figures is None:
            require_checkout()
        report = check_figures(args.figures, NOTEBOOKS_DIR if args.figures is None else None)
        print(report.text())
        return 0 if report.one_run else 1
    from .course.running.reproduce import reproduce
    reproduce(args.names, out_dir=args.out, smoke=args.smoke, results_dir=args.results, resume=args.resume)
    return 0


if __name__ == "__main__":
    sys.exit(main())
