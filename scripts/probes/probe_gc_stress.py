"""Probe: run GPU tests with the cyclic garbage collector at its most eager (gc.set_threshold(1, 1, 1)), so that a
check which depends on when garbage is collected fails every time instead of now and then.
    python scripts/probes/probe_gc_stress.py tests/test_guard_promise.py [more pytest args]"""
import gc
import sys

import pytest

gc.set_threshold(1, 1, 1)
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "--tb=long", "-m", "gpu", *sys.argv[1:]]))
