# The kit's pytest plugin for nbval (its options, the notebooks' small sizes, a results folder of the session):
# the one line a project built on the kit adds to the conftest.py at its root, too (README, "The kit in your own
# project"). Here at the root, so `python -m pytest notebooks/` and `python -m pytest -p no:nbval` get it as well.
pytest_plugins = ["cudagraph_kit.course.running.nbval_plugin"]
