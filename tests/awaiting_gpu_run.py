"""The notebooks whose GPU recording is still owed, with the reason: their committed ``.ipynb`` ran older code.

Read by ``tests/test_notebook_sources.py`` (its check of the committed notebook is an expected failure for them;
strict: once the executed notebook is committed it passes, the xfail turns into a failure, and the entry must go), by
``tests/test_notebook_budget.py`` (their printed output is not counted from an older run) and by the ``conftest.py`` at
the checkout's root (nbval skips their committed notebooks, which hold older code; tests/test_nb_NN.py runs the
sources)."""

# Every notebook was recorded on the H200 on 2026-11-29 (run 20261129T032712Z-a4d3c5ec). Since then, from new
# readers of that recording:
AWAITING_GPU_RUN: dict = {
    "01_gelu": "takeaway 3 says the gain shrinks as the work grows (it said large work gains little, beside a large "
               "tensor measured 1.10-1.46x)",
    "03_jit_compile": "takeaway 3 scopes 'fusion and a graph add up' to the small GELU; takeaway 4 says reduce-overhead "
                      "pays against default torch.compile and names what beat it in training",
    "04_resnet50": "takeaway 3 says the timed step is the AMP step without clipping or a schedule",
    "06_variable_shapes": "takeaway 3 says what a planner buys depends on the traffic",
}
