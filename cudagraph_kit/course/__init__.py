"""The course around the library, in four folders by job.

Each folder imports only the library and the folders listed before it:

- ``running/``: run and record the notebooks: where a checkout keeps them (``paths``), every notebook headless
  (``reproduce``) with a watch on each cell (``watchdog``, ``kernel_hook``), which run made a results folder
  (``runs``), writes that are whole or absent (``files``), the Colab rehearsal (``colab_rehearsal``), the
  notebooks' setup cell (``setup_notebook``) and nbval over committed notebooks (``nbval_plugin``);
- ``measuring/``: time an experiment (``measure``), judge it (``claims``, ``verdicts``), draw it (``figures``),
  take a call's time apart (``breakdowns``), compare a graphed run with eager (``correctness``) and advise's
  predictions with measurements (``predictions``), and save, load and show a notebook's results (``results``);
- ``lessons/``: what the lessons run: their models (``models``, ``vision``, ``tiny_llm``), decoding (``decode``,
  ``hf_decode``), the compilers' behaviour (``compilers``), workloads (``workloads``), notebook 06's bucket
  strategies (``buckets``) and notebook 05's pitfall experiments (``pitfall_scripts``, read by ``pitfalls``);
- ``exercises/``: the exercises' checks, one module per notebook (``nbNN_<name>``, named as its solutions file),
  and the machinery they share (``checking``).

The course imports the library; the library never imports the course, so ``import cudagraph_kit`` loads the
helpers alone. Example::

    from cudagraph_kit.course.measuring import results
    recorded = results.load("01_gelu", root=results.recorded_root())
"""
