"""cudagraph_kit.show: the timeline and graph pictures, fed synthetic traces and DOT text on the CPU, and a real
GELU on the GPU."""
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from cudagraph_kit import show  # noqa: E402

MUL = ("void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor<float, float, float, "
       "at::native::binary_internal::MulFunctor<float> >, std::array<char*, 2ul> >(int, "
       "at::native::AUnaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> >, "
       "std::array<char*, 2ul>)")
ERF = ("void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::erf_kernel_cuda("
       "at::TensorIteratorBase&)::{lambda()#1}::operator()() const::{lambda()#2}::operator()() const::"
       "{lambda(float)#1}, std::array<char*, 2ul> >(int, float, std::array<char*, 2ul>)")
ADD = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctorOnSelf_add<float>, std::array<char*, 2ul> >(int)"


def _x(cat, name, ts, dur):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 0}


def eager_trace(t0=1000.0, kernels=5, launch=6.0, run=2.0):
    """Five launches 6 µs apart, each kernel running 2 µs once launched: the GPU idles between kernels."""
    events = [_x("cpu_op", "aten::mul", t0 - 5, 100), {"ph": "i", "name": "marker", "ts": t0}]
    for i in range(kernels):
        start = t0 + i * launch
        events.append(_x("cuda_runtime", "cudaLaunchKernel", start, 4.0))
        events.append(_x("kernel", MUL, start + 5.0, run))
    events.append(_x("cuda_runtime", "cudaDeviceSynchronize", t0 + kernels * launch, 8.0))
    return {"traceEvents": events}


def graph_trace(t0=50.0):
    events = [_x("cuda_runtime", "cudaGraphLaunch", t0, 5.0)]
    events += [_x("kernel", ERF, t0 + 6.0 + 2.2 * i, 2.0) for i in range(5)]
    events.append(_x("gpu_memcpy", "Memcpy DtoD (Device -> Device)", t0 + 20, 1.0))
    events.append(_x("kernel", "spin_kernel(long)", t0 - 500, 490))  # the kit's own GPU sleep: left out
    return {"traceEvents": events}


def test_trace_events_splits_host_and_gpu_and_starts_at_the_first_launch(tmp_path):
    ev = show.trace_events(eager_trace())
    assert [h["kind"] for h in ev["host"]] == ["kernel"] * 5 + ["other"]
    assert ev["host"][0]["start"] == 0.0 and ev["host"][1]["start"] == 6.0
    assert len(ev["gpu"]) == 5 and ev["gpu"][0]["start"] == 5.0 and ev["gpu"][0]["end"] == 7.0
    g = show.trace_events(graph_trace())
    assert [h["kind"] for h in g["host"]] == ["graph"]
    assert [e["cat"] for e in g["gpu"]] == ["kernel"] * 5 + ["gpu_memcpy"]  # spin kernel dropped
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(graph_trace()))
    assert show.trace_events(path) == g  # a Chrome-trace file reads the same as the dict


def test_a_trace_without_cuda_activity_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="ProfilerActivity.CUDA"):
        show.trace_events({"traceEvents": [_x("cpu_op", "aten::mul", 0, 3)]})


def test_timeline_draws_one_bar_per_event_and_reports_the_idle_gpu():
    fig, ax = plt.subplots()
    show.timeline(eager_trace(), ax=ax, title="eager")
    bars = ax.collections
    assert len(bars) == 6 + 5  # six host calls, five kernels
    title = ax.get_title(loc="left")
    assert title.startswith("eager: 5 kernel launches, 0 graph launches")
    # busy 5 x 2 µs out of the window that ends with the synchronize's launch-less tail (last kernel at 31 µs)
    assert "GPU busy 10 of" in title
    plt.close(fig)


def test_timelines_share_one_time_scale():
    fig = show.timelines({"eager": eager_trace(), "graph": graph_trace()}, title="GELU")
    eager_ax, graph_ax = fig.axes
    assert eager_ax.get_xlim() == graph_ax.get_xlim()
    assert eager_ax.get_xlim()[1] >= 31.0  # the longer (eager) trace sets the scale
    assert "1 graph launches" in graph_ax.get_title(loc="left")
    plt.close(fig)
    with pytest.raises(ValueError):
        show.timelines({})


def test_short_kernel_name_names_the_kernel_and_its_operation():
    assert show.short_kernel_name(MUL) == "vectorized_elementwise_kernel [Mul]"
    assert show.short_kernel_name(ERF) == "vectorized_elementwise_kernel [erf]"
    assert show.short_kernel_name(ADD) == "vectorized_elementwise_kernel [add]"
    assert show.short_kernel_name("ampere_sgemm_128x64_nn") == "ampere_sgemm_128x64_nn"


def _record_label(kind, name):
    """A node label as CUDA's verbose DOT dump writes it: a record whose fields escape < > { } |."""
    esc = name.replace("<", "\\<").replace(">", "\\>").replace("{", "\\{").replace("}", "\\}")
    return (f'{{\n{kind}\n| {{\nID | 0 | {esc}\n}}\n| {{\n{{node handle | func handle}} | {{0x55d0 | 0x7f00}}\n}}'
            f'\n| {{\n{{gridDim | blockDim | sharedMem}} | {{(1,1,1) | (128,1,1) | 0}}\n}}\n}}')


DOT = "\n".join([
    "digraph dot {",
    "subgraph cluster_1 {",
    'label="graph_1" graph[style="dashed"];',
    f'"graph_1_node_0"[style="solid" shape="record" label="{_record_label("KERNEL", MUL)}"];',
    f'"graph_1_node_1"[style="solid" shape="record" label="{_record_label("KERNEL", ERF)}"];',
    f'"graph_1_node_2"[style="solid" shape="record" label="{_record_label("KERNEL", ADD)}"];',
    '"graph_1_node_3"[style="solid" shape="record" label="{\nMEMCPY\n| {\nID | 3\n}\n| {\n{src | dst} | {0x1 | 0x2}\n}\n}"];',
    '"graph_1_node_0" -> "graph_1_node_2";',
    '"graph_1_node_1" -> "graph_1_node_2";',
    '"graph_1_node_2" -> "graph_1_node_3" [style="solid"];',
    "}", "}"])


def test_parse_dot_reads_nodes_kinds_labels_and_edges():
    nodes, edges = show.parse_dot(DOT)
    assert [n["id"] for n in nodes] == [f"graph_1_node_{i}" for i in range(4)]
    assert [n["kind"] for n in nodes] == ["kernel", "kernel", "kernel", "memcpy"]
    assert [n["label"] for n in nodes] == ["vectorized_elementwise_kernel [Mul]", "vectorized_elementwise_kernel [erf]",
                                           "vectorized_elementwise_kernel [add]", "memcpy"]
    assert edges == [("graph_1_node_0", "graph_1_node_2"), ("graph_1_node_1", "graph_1_node_2"),
                     ("graph_1_node_2", "graph_1_node_3")]


def test_parse_dot_of_a_plain_label_graph():
    text = 'digraph g { "a" [label="KERNEL\\nmy_kernel(float*)"]; b [label="EMPTY"]; "a" -> b; }'
    nodes, edges = show.parse_dot(text)
    assert [(n["id"], n["kind"], n["label"]) for n in nodes] == [("a", "kernel", "my_kernel"), ("b", "empty", "empty")]
    assert edges == [("a", "b")]


def test_draw_graph_puts_independent_nodes_side_by_side():
    nodes, edges = show.parse_dot(DOT)
    fig, ax = plt.subplots()
    show.draw_graph(nodes, edges, ax=ax, title="t")
    pos = {t.get_text(): t.get_position() for t in ax.texts}
    mul, erf = pos["vectorized_elementwise_kernel [Mul]"], pos["vectorized_elementwise_kernel [erf]"]
    add, copy = pos["vectorized_elementwise_kernel [add]"], pos["memcpy"]
    assert mul[1] == erf[1] > add[1] > copy[1] and mul[0] != erf[0]
    assert len([c for c in ax.get_children() if type(c).__name__ == "Annotation"]) == 3  # one arrow per edge
    plt.close(fig)
    with pytest.raises(ValueError, match="no nodes"):
        show.draw_graph([])


def test_draw_graph_lays_out_a_long_chain_listed_last_first():
    """A 900-node chain listed from its last node to its first (a recursive layering ran out of stack here): one
    node per level, in chain order, one arrow per edge."""
    n = 900
    nodes = [{"id": f"n{i}", "kind": "kernel", "label": f"k{i}"} for i in reversed(range(n))]
    edges = [(f"n{i}", f"n{i + 1}") for i in range(n - 1)]
    fig, ax = plt.subplots()
    show.draw_graph(nodes, edges, ax=ax)
    y = {t.get_text(): t.get_position()[1] for t in ax.texts}
    assert [y[f"k{i}"] for i in range(n)] == [-i for i in range(n)]
    assert len([c for c in ax.get_children() if type(c).__name__ == "Annotation"]) == n - 1
    plt.close(fig)


def test_draw_graph_of_a_graph_with_a_cycle_stops():
    """No CUDA graph has a cycle, but a hand-written DOT file may: the layering breaks it instead of looping."""
    nodes = [{"id": i, "kind": "kernel", "label": i} for i in "abcd"]
    fig, ax = plt.subplots()
    show.draw_graph(nodes, [("a", "b"), ("b", "c"), ("c", "b"), ("c", "d")], ax=ax)
    y = {t.get_text(): t.get_position()[1] for t in ax.texts}
    assert y["a"] > y["b"] > y["c"] > y["d"]
    plt.close(fig)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given without CUDA")
def test_without_cuda_the_recorders_say_they_need_a_gpu():
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        show.record(lambda: None)
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        show.graph_nodes(lambda x: x * 2, torch.ones(2))


def gelu(x):
    return x * 0.5 * (1.0 + torch.erf(x / 1.41421))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_gelu_timeline_and_graph_nodes(tmp_path):
    x = torch.randn(1, 3, 224, 224, device="cuda")
    static = x.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            gelu(static)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = gelu(static)
    g.replay()
    torch.testing.assert_close(out, gelu(x))  # correct before drawn

    eager, graph = show.record(gelu, x, calls=3), show.record(g.replay, calls=3)
    e, r = show.trace_events(eager), show.trace_events(graph)
    assert sum(h["kind"] == "kernel" for h in e["host"]) == 15 and sum(h["kind"] == "graph" for h in e["host"]) == 0
    assert sum(h["kind"] == "graph" for h in r["host"]) == 3 and sum(h["kind"] == "kernel" for h in r["host"]) == 0
    assert len([k for k in e["gpu"] if k["cat"] == "kernel"]) == 15
    assert len([k for k in r["gpu"] if k["cat"] == "kernel"]) == 15  # the graph's kernels are seen on the GPU
    fig = show.timelines({"eager": eager, "CUDA graph": graph})
    fig.savefig(tmp_path / "timeline.png")
    plt.close(fig)

    nodes, edges, source = show.graph_nodes(gelu, x)
    print(f"graph_nodes source: {source}; nodes: {[n['label'] for n in nodes]}; edges: {len(edges)}")
    assert source in ("dot", "profiler")
    kernels = [n for n in nodes if n["kind"] == "kernel"]
    assert len(kernels) == 5, nodes
    assert any("erf" in n["label"] for n in kernels)
    if source == "dot":  # five kernels in a chain: each depends on an earlier one
        assert len(edges) >= 4
    ax = show.draw_graph(nodes, edges, title=f"gelu ({source})")
    ax.figure.savefig(tmp_path / "graph_nodes.png")
    plt.close(ax.figure)
    # a graph made after profiling still matches eager
    torch.testing.assert_close(gelu(x), out)


def test_a_recorded_range_keeps_only_its_calls_and_the_gpu_work_they_launched():
    events = [
        _x("cuda_runtime", "cudaLaunchKernel", 0, 3) | {"args": {"correlation": 1}},   # before the range
        _x("kernel", "spin_kernel(long)", 4, 500) | {"args": {"correlation": 1}},
        _x("user_annotation", show.MARK, 600, 30),
        _x("cuda_runtime", "cudaGraphLaunch", 601, 5) | {"args": {"correlation": 7}},
        _x("kernel", ERF, 607, 2) | {"args": {"correlation": 7}},
        _x("kernel", MUL, 610, 2) | {"args": {"correlation": 7}},
        _x("cuda_runtime", "cudaLaunchKernel", 700, 3) | {"args": {"correlation": 9}},  # after the range
        _x("kernel", ADD, 705, 2) | {"args": {"correlation": 9}},
    ]
    ev = show.trace_events({"traceEvents": events})
    assert [h["name"] for h in ev["host"]] == ["cudaGraphLaunch"] and ev["host"][0]["start"] == 0.0
    assert [g["name"] for g in ev["gpu"]] == [ERF, MUL] and ev["gpu"][0]["start"] == 6.0


# node 1 of a real DOT dump (PyTorch 2.11, H100): mangled names, the launch configuration appended
REAL_DOT = r'''digraph dot {
subgraph cluster_4 {
label="graph_4" graph[style="dashed"];
"graph_4_node_0"[style="bold" shape="record" label="{KERNEL
| {ID | 0 (topoId: 1) | _ZN2at6native29vectorized_elementwise_kernelILi4ENS0_13AUnaryFunctorIfffNS0_15binary_internal10MulFunctorIfEEEESt5arrayIPcLm2EEEEviT0_T1_\<\<\<1,128,0\>\>\>}
| {{node handle | func handle} | {0x000000001705B298 | 0x00000000149880F0}}
| {accessPolicyWindow | {base_ptr | num_bytes | hitRatio | hitProp | missProp} | {0x0000000000000000 | 0 | 0.000000 | N | N}}
| {cooperative | 0}
| {priority | 0}
}"];

"graph_4_node_1"[style="bold" shape="record" label="{KERNEL
| {ID | 1 (topoId: 0) | _ZN2at6native29vectorized_elementwise_kernelILi4EZZZNS0_15erf_kernel_cudaERNS_18TensorIteratorBaseEENKUlvE_clEvENKUlvE0_clEvEUlfE_St5arrayIPcLm2EEEEviT0_T1_\<\<\<1,128,0\>\>\>}
| {{node handle | func handle} | {0x000000001705AB30 | 0x000000001546E690}}
| {cooperative | 0}
}"];

"graph_4_node_0" -> "graph_4_node_1" [headlabel=0];
}
}
'''


def test_parse_dot_of_a_real_dump_demangles_the_kernel_names():
    nodes, edges = show.parse_dot(REAL_DOT)
    assert [n["label"] for n in nodes] == ["vectorized_elementwise_kernel [Mul]", "vectorized_elementwise_kernel [erf]"]
    assert edges == [("graph_4_node_0", "graph_4_node_1")]


def test_demangle_without_pytorchs_demangler_still_names_kernel_and_operation(monkeypatch):
    monkeypatch.delattr(torch._C, "_demangle", raising=False)
    mangled = "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_21CUDAFunctorOnSelf_addIfEESt5arrayIPcLm2EEEEviT0_T1_"
    assert show.demangle(mangled).startswith("at::native::vectorized_elementwise_kernel<")
    assert show.short_kernel_name(mangled) == "vectorized_elementwise_kernel [add]"
    assert show.demangle("sm90_xmma_gemm") == "sm90_xmma_gemm"
