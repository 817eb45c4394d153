"""Measuring an experiment and saying what it showed.

``measure`` times the variants over windows, ``claims`` and ``verdicts`` turn intervals into sentences, ``figures``
draws, ``breakdowns`` takes a call's time apart, ``correctness`` compares a graphed run with the eager one,
``predictions`` puts advise's predictions beside measurements, and ``results`` saves, loads and shows a notebook's
results. Imports ``running/`` (paths and atomic writes)."""
