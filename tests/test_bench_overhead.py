"""scripts/bench_overhead.py's summary: the median of the per-round differences to the hand-written replay, and their
mean, which carries a cost that lands in some bursts only (the guard's scheduled full check)."""
import sys

from cudagraph_kit.course.running.paths import PROJECT_ROOT

sys.path.insert(0, str(PROJECT_ROOT / "scripts"))
import bench_overhead  # noqa: E402


def test_the_mean_carries_a_cost_that_lands_in_some_bursts_only():
    rows = [{"case": "mlp48", "variant": v, "round": r, "us_per_call": us}
            for r, (hand, kit) in enumerate([(10, 12), (11, 13), (10, 12), (10, 16)])
            for v, us in (("hand_written", hand), ("kit", kit))]
    out = {r["variant"]: r for r in bench_overhead.summarize(rows, {}, ["mlp48"])}
    assert out["kit"]["minus_hand_written_median_us"] == 2 and out["kit"]["minus_hand_written_mean_us"] == 3
    assert out["hand_written"]["minus_hand_written_mean_us"] == 0


def test_a_failed_variant_has_no_numbers():
    rows = [{"case": "llama", "variant": "hand_written", "round": 0, "us_per_call": 20.0}]
    out = {r["variant"]: r for r in bench_overhead.summarize(rows, {("llama", "kit"): "boom"}, ["llama"])}
    kit = out["kit"]
    assert kit["status"] == "failed: boom" and kit["rounds"] == 0
    assert kit["minus_hand_written_mean_us"] != kit["minus_hand_written_mean_us"]   # NaN
