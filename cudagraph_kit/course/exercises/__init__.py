"""The exercises' checks.

One module per notebook, named as its solutions file in ``notebooks/solutions/`` (``nb01_gelu`` ...
``nb08_llm_decode``), and the machinery they share (``checking``: ``@exercise``, ``@check``, the report and its
verdicts). Imports ``lessons/``."""
