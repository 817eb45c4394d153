"""Running and recording the notebooks.

``reproduce`` executes every notebook headless and publishes what it recorded, ``watchdog`` and ``kernel_hook``
watch each cell, ``runs`` says which run made a results folder, ``files`` writes whole or not at all,
``colab_rehearsal`` runs them under a Colab T4's limits; ``setup_notebook`` is what each notebook's first cell calls
and ``nbval_plugin`` sets up nbval; ``paths`` says where a checkout keeps them. Imports no other folder of the
course."""
