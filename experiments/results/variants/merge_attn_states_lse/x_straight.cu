// Experiment x_straight: the 4d15563 sweep winner (merge/pairs, PAIRS=16, ITEMS=1, HINT=1) cut to
// a straight line: one 16-byte vector of each state per thread (blockDim.x = head_dim / 8), no
// vector loop, no alignment branch, no scalar path, 32-bit offsets. The winner issues its lse
// loads as its 46th instruction and its first 16-byte load as its 64th (0x3f0), after three
// branches; this one issues all four loads by its 28th (0x1b0) (nvdisasm, sm_90). A block lives about
// one trip to memory, so what a block spends before its loads repeats in every block: timed on
// the recipe map, this says whether that is where FlashInfer's merge_state_in_place gains on
// the largest shapes. Not a valid kernel in general: it assumes head_dim a multiple of 8 and at
// most 256, 16-byte aligned pointers and fewer than 2^31 elements per state (checked on the CPU
// shim at [3, 5, 128], [2, 32, 256] and [1, 3, 64]).
// merge_attn_states_lse: merge two partial attention states by their base-2 log-sum-exp, per (token, head):
// m = max(sa, sb); wa = 2^(sa - m); wb = 2^(sb - m); out = (va * wa + vb * wb) / (wa + wb);
// lse = log2(wa + wb) + m; both states empty (-inf) gives out = 0, lse = -inf.
// launch: grid=(cdiv(num_tokens * num_heads, PAIRS),) block=(min(32, cdiv(head_dim, 8)), PAIRS) smem=0
// flags: --use_fast_math
// tune: PAIRS=16,8,4
// tune: HINT=1,2,0
#ifndef PAIRS
#define PAIRS 16
#endif
#ifndef HINT
#define HINT 1
#endif

__device__ __forceinline__ uint4 load16(const uint4* p) {
#if HINT == 1 || HINT == 2
    return __ldcs(p);  // streamed: read once
#else
    return *p;
#endif
}

__device__ __forceinline__ void store16(uint4* p, uint4 v) {
#if HINT == 1
    __stcs(p, v);
#else
    *p = v;
#endif
}

union Vec16 {
    uint4 raw;
    scalar_t e[8];
};

extern "C" __global__ void __launch_bounds__(32 * PAIRS) merge_attn_states_lse(
    scalar_t* __restrict__ v_out,
    float* __restrict__ s_out,
    const scalar_t* __restrict__ v_a,
    const float* __restrict__ s_a,
    const scalar_t* __restrict__ v_b,
    const float* __restrict__ s_b,
    int num_tokens,
    int num_heads,
    int head_dim) {
    const int pair = blockIdx.x * PAIRS + threadIdx.y;
    if (pair >= num_tokens * num_heads) return;
    const int j = pair * (head_dim >> 3) + threadIdx.x;  // this thread's 16-byte vector
    Vec16 a, b, o;
    a.raw = load16(reinterpret_cast<const uint4*>(v_a) + j);
    b.raw = load16(reinterpret_cast<const uint4*>(v_b) + j);
    const float sa = s_a[pair], sb = s_b[pair];
    const float neg_inf = __int_as_float(0xff800000u);
    const float m = fmaxf(sa, sb);
    float fa = 0.0f, fb = 0.0f, lse = neg_inf;
    if (m != neg_inf) {  // both empty: m - m would be NaN
        const float wa = exp2f(sa - m);
        const float wb = exp2f(sb - m);
        const float inv = 1.0f / (wa + wb);
        fa = wa * inv;
        fb = wb * inv;
        lse = log2f(wa + wb) + m;
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        o.e[e] = static_cast<scalar_t>(static_cast<float>(a.e[e]) * fa + static_cast<float>(b.e[e]) * fb);
    }
    store16(reinterpret_cast<uint4*>(v_out) + j, o.raw);
    if (threadIdx.x == 0) s_out[pair] = lse;
}
