// Experiment x_straight: the 750c670 winner (gated_act/tiles) cut to a straight line from the
// kernel's entry to its first load: the row loop out of line (rows past grid.y's 65535 only),
// BLOCK a constant instead of blockDim.x, 32-bit offsets, no alignment branch, no scalar path. Its first 16-byte load is the 15th
// instruction (0xe0), after one exit branch; the winner's is the 48th (0x2f0), after two branches
// and inside the row loop; a hand-written Triton equivalent of Inductor's pointwise kernel for
// silu_and_mul (XBLOCK 1024, 4 warps, compiled offline by Triton 3.6 for sm_90) issues both loads
// by its 27th instruction (0x1a0) with no branch (nvdisasm of each). code-fetch-h200.md measured
// code fetch after the L2 flush at 0.16 us for 4 taken jumps and 0.67 us for 16 in a probe.
// Timed on the recipe map, this says whether that distance is what torch.compile gains on the
// smallest shapes. Not a valid kernel in general: it assumes d % 8 == 0, 16-byte aligned
// pointers and fewer than 2^31 elements in x (checked on the CPU shim at [3, 1000], [5, 4096]
// and [1, 11008], BLOCK 128 and 512, and with grid.y capped at 2 on [5, 4096]).
// silu_and_mul: out[t, i] = act(x[t, i]) * x[t, d + i], act computed in fp32 and rounded once.
// launch: grid=(cdiv(d, BLOCK * 8), min(num_tokens, 65535)) block=(BLOCK,) smem=0
// flags: --use_fast_math
// tune: BLOCK=128,256,512
#ifndef BLOCK
#define BLOCK 128
#endif

constexpr int VEC = 16 / sizeof(scalar_t);

__device__ __forceinline__ float act(float g) { return g / (1.0f + expf(-g)); }

union Vec16 {
    uint4 raw;
    scalar_t e[VEC];
};

__device__ __forceinline__ void one_row(scalar_t* __restrict__ out, const scalar_t* __restrict__ x,
                                        int per_row, int row, int i) {
    const uint4* g16 = reinterpret_cast<const uint4*>(x) + (2 * row * per_row + i);
    Vec16 gv, uv, ov;
    gv.raw = *g16;
    uv.raw = *(g16 + per_row);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
        ov.e[k] = static_cast<scalar_t>(act(static_cast<float>(gv.e[k])) * static_cast<float>(uv.e[k]));
    }
    reinterpret_cast<uint4*>(out)[row * per_row + i] = ov.raw;
}

// Rows past grid.y (more than 65535 tokens), after the block's first row and out of line.
__device__ __noinline__ void later_rows(scalar_t* __restrict__ out, const scalar_t* __restrict__ x,
                                        int per_row, int rows, int i) {
    for (int row = blockIdx.y + gridDim.y; row < rows; row += gridDim.y) one_row(out, x, per_row, row, i);
}

extern "C" __global__ void __launch_bounds__(BLOCK) silu_and_mul(
    scalar_t* __restrict__ out,
    const scalar_t* __restrict__ x,
    int num_tokens,
    int d) {
    const int per_row = d >> 3;  // 16-byte vectors per row of out (fp16/bf16)
    const int i = blockIdx.x * BLOCK + threadIdx.x;
    if (i >= per_row) return;
    one_row(out, x, per_row, blockIdx.y, i);
    if (num_tokens > static_cast<int>(gridDim.y)) later_rows(out, x, per_row, num_tokens, i);
}
