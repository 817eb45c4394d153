"""What the lessons run: their models, workloads and experiments.

Their models (``models``, ``vision``, ``tiny_llm``), decoding (``decode``, ``hf_decode``), what the compilers do
(``compilers``), the workloads beyond one call (``workloads``), notebook 06's bucket strategies (``buckets``) and
notebook 05's pitfall experiments (``pitfall_scripts``, each in a process of its own) with what they found
(``pitfalls``). Imports ``measuring/`` and ``running/``."""
