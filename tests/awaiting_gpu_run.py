"""The notebooks whose GPU recording is still owed, with the reason: their committed ``.ipynb`` ran older code.

Read by ``tests/test_notebook_sources.py`` (its check of the committed notebook is an expected failure for them;
strict: once the executed notebook is committed it passes, the xfail turns into a failure, and the entry must go), by
``tests/test_notebook_budget.py`` (their printed output is not counted from an older run) and by the ``conftest.py`` at
the checkout's root (nbval skips their committed notebooks, which hold older code; tests/test_nb_NN.py runs the
sources)."""

# Every notebook was recorded on the H200 on 2026-11-28 (run 20261128T225329Z). Since then:
AWAITING_GPU_RUN: dict = {
    "02_train_step": "takeaway 5 says where AMP's gains are instead of 'works the same way'",
    "04_resnet50": "section 4's core table shows each published speedup beside this run's (the published times and "
                   "the plain PyTorch reference rows moved to Going further D)",
    "05_pitfalls": "the refusal line ends at a whole sentence, verify's dropout check is printed, takeaways 1-2 claim "
                   "only what the core showed",
    "06_variable_shapes": "section 7 prints one line per model and keeps the expected overflow warning quiet; takeaway "
                          "2 states each model's shared pool against its largest bucket (the H200 run of 2026-11-28 "
                          "printed 857 words in the core, over its 840)",
    "07_data_parallel": "samples per second for the MLP, p99 explained, section 5 in plain words, the rule-1 cell "
                        "without a GPU shows only the recorded message",
}
