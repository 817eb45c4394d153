"""The notebooks whose GPU recording is still owed, with the reason: their committed ``.ipynb`` ran older code.

Read by ``tests/test_notebook_sources.py`` (its check of the committed notebook is an expected failure for them;
strict: once the executed notebook is committed it passes, the xfail turns into a failure, and the entry must go), by
``tests/test_notebook_budget.py`` (their printed output is not counted from an older run) and by the ``conftest.py`` at
the checkout's root (nbval skips their committed notebooks, which hold older code; tests/test_nb_NN.py runs the
sources)."""

# Every notebook was recorded on the H200 on 2026-11-28 (run 20261128T225329Z). Since then:
AWAITING_GPU_RUN: dict = {
    "04_resnet50": "section 4's core table shows each published speedup beside this run's (the published times and "
                   "the plain PyTorch reference rows moved to Going further D): held from the last recording",
    "05_pitfalls": "the refusal line ends at a whole sentence, verify's dropout check is printed, takeaways 1-2 claim "
                   "only what the core showed: held from the last recording",
    "07_data_parallel": "samples per second for the MLP, p99 explained, section 5 in plain words, the rule-1 cell "
                        "without a GPU shows only the recorded message: held from the last recording",
    "06_variable_shapes": "section 7 prints one line per model instead of the error table, to bring the core's printed "
                          "output within its budget (the H200 run printed 857 words); the committed notebook is that "
                          "run until reproduce records it again",
}
