"""Notebook 08 (LLM decoding) executed by papermill, small; assertions on what it computed and recorded."""
import json

import pandas as pd
import pytest
import torch

pytestmark = pytest.mark.notebook
HAS_CUDA = torch.cuda.is_available()


def test_llm_decode_notebook_checks_correctness_and_records_honest_results(run_notebook):
    folder = run_notebook("08_llm_decode", SMOKE=True)
    df = pd.read_csv(folder / "results.csv")
    env = json.loads((folder / "env.json").read_text())
    batches = env["batches"]
    # correct before fast: the static cache decodes exactly as recomputing everything, for every batch size
    assert env["nocache_parity"]["tokens_equal"] is True
    assert set(map(int, env["nocache_parity"]["per_batch"])) == set(batches)
    assert all(p["max_logit_diff"] < 1e-3 for p in env["nocache_parity"]["per_batch"].values())
    checks = df[df.case == "correctness"]
    assert set(checks.batch.astype(int)) == set(batches)
    assert (checks.tokens_equal.astype(str) == "True").all(), checks
    assert {"eager", "kit graphs per bucket"} <= set(checks.variant)
    try:
        import transformers  # noqa: F401
        # the transformers model with the same weights computes the same function and decodes the same tokens
        assert env["transformers"] and env["hf_logit_diff"] is not None and env["hf_logit_diff"] < 1e-4
        hf = checks[checks.variant.str.startswith("transformers")]
        assert len(hf) == 2 * len(batches) and (hf.max_logit_diff < 1e-4).all()
    except ImportError:
        assert env["transformers"] is None
    assert not env["variant_errors"], env["variant_errors"]

    for b in batches:
        step = df[df.case == f"decode step, batch {b}"]
        assert step.variant.iloc[0] == "eager" and step.speedup.iloc[0] == 1.0
        assert (step.median_us > 0).all() and (step.tokens_per_s > 0).all()
        gen = df[df.case == f"generate, batch {b}"]
        assert gen.variant.iloc[0] == "eager" and len(gen) == len(checks[checks.batch == b])
        assert (gen.us_per_token > 0).all()
    serve = df[df.case == "serving loop"]
    assert len(serve) == 4 and serve.variant.iloc[0] == "eager"
    assert (serve.same_tokens_as_eager == 1.0).all(), serve[["variant", "same_tokens_as_eager"]]
    planned = serve[serve.variant.str.contains("planned")].iloc[0]
    ladder = serve[serve.variant.str.contains("ladder")].iloc[0]
    assert planned.graphs <= ladder.graphs and planned.pad_fraction <= ladder.pad_fraction + 1e-9
    assert serve[serve.variant.str.contains("one per batch size")].pad_fraction.iloc[0] == 0
    assert len(df[df.case.str.startswith("prefill")]) == 2
    capture = df[df.case == "capture"]

    if HAS_CUDA:
        assert env["executed_as"] == "cuda"
        timed = df[df.median_us.notna()]
        assert (timed[timed.variant == "eager"].executed_as == "eager").all()
        assert (timed[timed.variant.str.startswith(("kit", "graphs"))].executed_as == "cuda graph").all()
        assert sorted(capture.batch.astype(int)) == sorted(env["ladder"]) and (capture.setup_s > 0).all()
    else:
        # honest labels: nothing that ran on the CPU is called a graph
        assert env["executed_as"] == "cpu (eager only)" and env["gpu"] is None
        timed = df[df.median_us.notna()]
        assert (timed.executed_as == "eager").all()
        assert timed[timed.variant.str.contains("graph")].variant.str.endswith("(eager fallback)").all()
        assert not df.variant.str.startswith("reduce-overhead").any() and capture.empty  # nothing was captured
    assert (folder / "decode.png").stat().st_size > 10_000
