"""The course around the library: where the notebooks and recorded figures live (``paths``), a notebook's saved
results (``results``), running every notebook headless (``reproduce``), the exercises' checks (``exercises``)
and the pitfall experiments that need a process of their own (``pitfall_scripts``).

The course imports the library; the library never imports the course, so ``import cudagraph_kit`` loads the
helpers alone. Example::

    from cudagraph_kit.course import results
    recorded = results.load("01_gelu", root=results.recorded_root())
"""
