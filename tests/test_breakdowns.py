"""The kernel summary of measuring/breakdowns.py (notebook 03's appendix): readable names, kernels of one name added
up, the largest first."""
from cudagraph_kit.course.measuring.breakdowns import _top_kernels

MUL = ("void at::native::vectorized_elementwise_kernel<4, at::native::MulFunctor<float>, std::array<char*, 3ul> >"
       "(int, at::native::MulFunctor<float>, std::array<char*, 3ul>)")
GEMM = "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize64x64x32_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"


def test_top_kernels_are_short_added_up_and_largest_first():
    top = [(MUL, 1.4), (MUL.replace("<4,", "<2,"), 1.2), (GEMM, 49.1), ("triton_poi_fused_add_div_erf_mul_0", 1.3),
           ("x" * 80, 0.5)]
    assert _top_kernels(top) == ("cuBLAS gemm 64x64x32 49.1; vectorized_elementwise_kernel [Mul] 2x 2.6; "
                                 "triton_poi_fused_add_div_erf_mul_0 1.3")
    assert _top_kernels([("y" * 80, 1.0)]) == "y" * 39 + "… 1.0"
