"""Tag the cells whose output nbval should compare: `nbval-check-output` in each notebook's jupytext source
(notebooks/NN_*.py, the `# %%` header line: reproduce rebuilds the .ipynb from it) and in the committed
notebooks/NN_*.ipynb (cell metadata), without re-executing anything.

    python scripts/apply_nbval_tags.py [ROOT]     # ROOT: the checkout (default: the current folder)

Each entry names the cell by its code-cell number (nbval's "Cell N") and its first line; the script stops
without writing anything if a first line differs (the notebook changed since the list was made).
"""
import json
import re
import sys
from pathlib import Path

TAG = "nbval-check-output"

CELLS = {  # notebook stem -> [(code cell number, first line)]; (A) shows something, (B) prints nothing
    "01_gelu": [
        (0, "# Setup. In Colab, install the kit of REPO_REF; `setup` then clones that ref, with its recorded GPU results."),  # B
        (1, "SMOKE = None           # tiny run (CI / tests): few sizes and calls; None reads $CGK_SMOKE (1 means on)"),  # B
        (9, "eager_s = sweep[sweep.variant == \"eager\"].set_index(\"numel\")"),  # A
        (11, "graphed_k = per_graph[per_graph.calls_per_graph.notna()]"),  # A
        (19, "from cudagraph_kit.course.exercises_01 import HOST_COPY_WHY, check_fp16_sweep, check_fused_gelu, check_host_copies"),  # B
        (20, "def fused_gelu(x):"),  # B
        (21, "check_fused_gelu(fused_gelu, fused_table, reference=main_table)"),  # A
        (22, "sweep16 = ...      # pd.concat of one compare() per size, each with \"numel\" and \"dtype\" columns"),  # B
        (23, "check_fp16_sweep(sweep16, crossover16, answer, reference_sweep=sweep)"),  # A
        (24, "kit_message = ...  # try: graphs[\"small\"](bad) / except ValueError as exc: kit_message = str(exc)"),  # A
        (26, "drift_dir = (results.recorded_root() or Path(\"figures\")) / \"drift\""),  # A
    ],
    "02_train_step": [
        (0, "# Setup. In Colab, install the kit of REPO_REF; `setup` then clones that ref, with its recorded GPU results."),  # B
        (1, "SMOKE = None          # tiny run for CI and tests; None reads CGK_SMOKE (on when 1)"),  # B
        (7, "fig_loss, axes = plt.subplots(1, len(curves), figsize=(5 * len(curves), 3.6), sharey=True)"),  # A
        (13, "def eager_amp_step(model, opt, dtype, scaler):"),  # B
        (21, "from cudagraph_kit.course.exercises_02 import STEP_PARTS, check_amp_adam, check_lr_schedule, check_short_batches"),  # B
        (22, "still_eager = ...     # a set of names from STEP_PARTS"),  # A
        (24, "graphed_model = ...  # trained through capture_train_step(..., eager_fallback=True), with the scheduler"),  # B
        (25, "check_lr_schedule(graphed_model, eager_model, optimizer, lrs)"),  # A
        (26, "short_batches = ...          # a list of (x, y) batches of several sizes"),  # B
        (27, "check_short_batches(short_batches, predicted_eager_steps, short_step, extra_us, timing)"),  # A
    ],
    "03_jit_compile": [
        (0, "# Setup. In Colab, install the kit of REPO_REF; `setup` then clones that ref, with its recorded GPU results."),  # B
        (1, "SMOKE = None       # tiny run (CI / tests): fewer calls, one small compile on a CPU; None: read $CGK_SMOKE (\"1\" = on)"),  # B
        (3, "def gelu(x):"),  # B
        (22, "from cudagraph_kit import compare  # noqa: F401 (the exercises time with it)"),  # B
        (23, "g10 = ...     # capture(compiled, inputs[\"small\"], calls_per_graph=10, eager_fallback=True)"),  # B
        (24, "check_compiled_calls_per_graph(g10, table1)"),  # A
        (25, "def make_mlp(layers, width):"),  # B
        (27, "keep_output = ...    # a function x -> an output that survives the next call"),  # B
        (29, "autotuned = ...       # torch.compile(fresh(gelu), mode=\"max-autotune-no-cudagraphs\", dynamic=False)"),  # B
    ],
    "04_resnet50": [
        (0, "# Setup. In Colab, install the kit of REPO_REF; `setup` then clones that ref, with its recorded GPU results."),  # B
        (1, "SMOKE = None            # tiny run for CI and tests; None reads CGK_SMOKE (on when 1)"),  # B
        (3, "def tag(name):"),  # B
        (6, "curve, infer_claims = {}, []"),  # B
        (8, "GRAPH_TRAIN = \"whole-step graph\""),  # B
        (9, "def train_case(amp, bs, opt_name, x, y):"),  # B
        (12, "X_train, X_val, Y_train, Y_val = parts.digits_split(DEVICE)"),  # B
        (13, "def train_digits(graphed, epochs=PARITY_EPOCHS, accumulate=1):"),  # B
        (20, "import numpy as np"),  # B
        (21, "new_batch = ...          # an int between two of INFER_BATCHES, not one of them"),  # B
        (22, "check_batch_prediction(new_batch, predicted_speedup, new_graph, new_table, bound,"),  # A
        (23, "norms_eager = ...       # one norm per step of the eager epoch"),  # B
        (24, "check_clip_norms(norms_eager, norms_graphed, clipped_fraction, max_norm=MAX_NORM, steps=steps_per_epoch)"),  # A
    ],
    "05_pitfalls": [
        (0, "# Setup. In Colab, install the kit of REPO_REF; `setup` then clones that ref, with its recorded GPU results."),  # B
        (1, "SMOKE = None                 # tiny run (CI / tests); None reads $CGK_SMOKE (1 means on)"),  # B
        (3, "import inspect"),  # B
        (10, "from cudagraph_kit.course.pitfall_scripts import docs_recipe_capture"),  # A
        (11, "def make_mlp(seed=0):"),  # B
        (14, "from cudagraph_kit.course.nb05_parts import short_cause, show_isolated"),  # A
        (16, "from cudagraph_kit.course.pitfall_scripts import CAPTURE_ERROR_MODES, background_thread_allocates"),  # A
        (19, "from cudagraph_kit.course.pitfall_scripts import reduce_overhead_pitfalls"),  # A
        (21, "from cudagraph_kit.course.pitfall_scripts import TWO_CAPTURE_VARIANTS, two_captures"),  # A
        (31, "import copy"),  # B
        (32, "class ScaledByStepFixed(torch.nn.Module):"),  # B
        (36, "class Box:"),  # A
    ],
    "06_variable_shapes": [
        (0, "# Setup. In Colab, install the kit of REPO_REF; `setup` then clones that ref, with its recorded GPU results."),  # B
        (1, "SMOKE = None          # tiny run for CI and tests; None reads CGK_SMOKE (on when 1)"),  # B
        (7, "ledger = MemoryLedger()"),  # B
        (14, "def request_latencies(fns, requests):"),  # B
        (16, "launches = {}"),  # B
        (19, "fig = plot_tradeoff(results_df, info, curve, TREES_POOL_MIB, MODELS, [\"exact sizes\", *FIXED, \"planned\"], CUDA)"),  # A
        (25, "from cudagraph_kit.course.exercises_06 import MIXING_WHY, check_batch_mixing, check_uniform_plan"),  # B
        (26, "uniform_sizes = ...  # HISTORY request sizes, uniform over 1..MAX_ROWS"),  # B
        (27, "check_uniform_plan(uniform_sizes, uniform_plan, moved, serve_uniform, max_rows=MAX_ROWS, skewed_sizes=history_sizes,"),  # A
        (28, "class BatchMixingBlock(Block):"),  # A
        (29, "check_batch_mixing(BatchMixingBlock, mixing_leak, why, d_block=D_BLOCK, heads=HEADS,"),  # A
    ],
    "07_data_parallel": [
        (0, "# Setup. In Colab, install the kit of REPO_REF; `setup` then clones that ref, with its recorded GPU results."),  # B
        (1, "SMOKE = None          # tiny run for CI and tests; None reads CGK_SMOKE (on when 1)"),  # B
        (9, "rec = results.show_recorded(SWEEP_STEM, columns=["),  # A
        (10, "def compare_sentence(label, e, g, ie, ig):"),  # A
        (12, "if rec is not None:"),  # A
        (13, "from cudagraph_kit.course.exercises_07 import check_item_per_step, check_rank_spread"),  # B
        (14, "rank_spread = ...  # {variant: (median spread in µs, per-step p99 spread in µs)}"),  # B
        (15, "check_rank_spread(rank_spread, local_steps)"),  # A
        (16, "item_table = ...    # compare({\"eager\": ..., \"whole-step graph\": ..., \"whole-step graph + loss.item()\": ...}, x, y, ...)"),  # B
        (17, "check_item_per_step(item_table, item_cost_us, keeps_lead)"),  # A
    ],
    "08_llm_decode": [
        (0, "# Setup. In Colab, install the kit of REPO_REF; `setup` then clones that ref, with its recorded GPU results."),  # B
        (1, "SMOKE = None          # tiny run for CI and tests; None reads CGK_SMOKE (on when 1)"),  # B
        (2, "import time"),  # B
        (8, "variant_errors = {}"),  # B
        (12, "claims = []   # every comparison this notebook states; the summary table and claims.csv at the end"),  # B
        (22, "where = torch.cuda.get_device_name(0) if CUDA else \"CPU (eager only: not a GPU result)\""),  # A
        (25, "from cudagraph_kit.course.exercises_08 import TIE_WHY, check_decode_buckets, check_k_step_decode, check_low_precision_ties"),  # B
        (26, "few_buckets = ...     # plan_buckets(history, max_graphs=4, max_size=MAX_BATCH)"),  # B
        (27, "check_decode_buckets(few_buckets, serve_few, few_tokens, pad_fraction, history=history, observed=observed,"),  # A
        (28, "bf16_tokens = ...        # greedy_generate on the bfloat16 model, static cache"),  # A
        (29, "check_low_precision_ties(bf16_tokens, bf16_reference, bf16_divergence, tie_why, prompt=prompts[MAX_BATCH],"),  # A
        (30, "ex3_prompt = kx[:K_BATCHES[-1]]"),  # B
        (31, "check_k_step_decode(k4_block, k4_graph, k4_tokens, model=model, cache=cache, prompt=ex3_prompt, stop_token=EX3_STOP,"),  # A
        (32, "kernels, sentence = kernel_table((results.recorded_root() or Path(\"figures\")) / \"08_decode_kernels\")"),  # A
    ],
}


def _first_line(source):
    return (source.strip().splitlines() or [""])[0]


def _code_headers(lines):
    """Indices of the `# %%` lines that open code cells in a py:percent file."""
    return [i for i, line in enumerate(lines) if re.match(r"^# %%(?!\s*\[)", line)]


def _with_tag(header):
    m = re.search(r"tags=(\[[^\]]*\])", header)
    if m:
        tags = json.loads(m.group(1))
        if TAG in tags:
            return header
        return header[:m.start(1)] + json.dumps(tags + [TAG]) + header[m.end(1):]
    return header.rstrip("\n") + f" tags={json.dumps([TAG])}" + ("\n" if header.endswith("\n") else "")


def plan(root: Path, cells=CELLS):
    """{path: new text} for every file to change; raises if a listed cell is not where the list says."""
    writes = {}
    for stem, wanted in cells.items():
        ipynb, source = root / "notebooks" / f"{stem}.ipynb", root / "notebooks" / f"{stem}.py"
        nb = json.loads(ipynb.read_text())
        code = [c for c in nb["cells"] if c["cell_type"] == "code"]
        lines = source.read_text().splitlines(keepends=True)
        headers = _code_headers(lines)
        if len(headers) != len(code):
            raise SystemExit(f"{source.name}: {len(headers)} code cells, {ipynb.name}: {len(code)}")
        for number, first in wanted:
            got = _first_line("".join(code[number]["source"]))
            if got != first:
                raise SystemExit(f"{ipynb.name} Cell {number} starts {got!r}, not {first!r}: list out of date")
            body = "".join(lines[headers[number] + 1:headers[number] + 1 + 40]).strip()
            if not body.startswith(first):
                raise SystemExit(f"{source.name}: the code cell after line {headers[number] + 1} is not Cell {number}")
            tags = code[number].setdefault("metadata", {}).setdefault("tags", [])
            if TAG not in tags:
                tags.append(TAG)
            lines[headers[number]] = _with_tag(lines[headers[number]])
        writes[ipynb] = json.dumps(nb, indent=1, ensure_ascii=False, sort_keys=True) + "\n"
        writes[source] = "".join(lines)
    return writes


def main(argv):
    root = Path(argv[0] if argv else ".").resolve()
    writes = plan(root)
    for path, text in writes.items():
        path.write_text(text)
    print(f"tagged {sum(len(v) for v in CELLS.values())} cells in {len(CELLS)} notebooks "
          f"({', '.join(sorted(p.name for p in writes))})")


if __name__ == "__main__":
    main(sys.argv[1:])
