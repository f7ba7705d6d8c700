// topk_softmax: p = softmax(x) per row in fp32; the topk largest p (ties to the lower index) and their ids; optionally divided by their sum.
// Recipe topk_softmax/warp: one warp per token, WARPS tokens per block, no shared memory and
// no barrier. Rows of up to 256 experts live in registers (PL consecutive experts per lane,
// one 16-byte load per lane when the row allows it); the max, the sum and every top-k round
// are warp-shuffle reductions. Round r picks the largest (p, lower index first) among the
// experts that come after round r-1's pick in that order, so nothing is marked or excluded.
// Longer rows are streamed from memory in every pass.
// launch: grid=(cdiv(num_tokens, WARPS),) block=(32, WARPS) smem=0
// flags: --use_fast_math
// tune: WARPS=4,2,8,1
#ifndef WARPS
#define WARPS 4
#endif

constexpr int VEC = 16 / sizeof(scalar_t);

template <int V>
struct alignas(sizeof(scalar_t) * V) Pack {
    scalar_t v[V];
};

__device__ __forceinline__ float warp_sum(float s) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    return s;
}

__device__ __forceinline__ float warp_max(float s) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s = fmaxf(s, __shfl_xor_sync(0xffffffffu, s, o));
    return s;
}

#define NEG_INF __int_as_float(0xff800000)

// (p, i) ranks before (q, j): larger probability first, equal probabilities by lower index.
__device__ __forceinline__ bool ranks_before(float p, int i, float q, int j) {
    return p > q || (p == q && i < j);
}

// The warp's best (p, i); every lane gets it.
__device__ __forceinline__ void warp_best(float& p, int& i) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float q = __shfl_xor_sync(0xffffffffu, p, o);
        const int j = __shfl_xor_sync(0xffffffffu, i, o);
        if (ranks_before(q, j, p, i)) {
            p = q;
            i = j;
        }
    }
}

// The top-k rounds' state: the previous pick and the sum of the picks so far.
struct Picks {
    float last_p = 2.0f;  // above every probability: round 0 may pick anything
    int last_i = -1;
    float total = 0.0f;

    // (p, i) becomes this lane's candidate if it comes after the previous pick and before (bp, bi).
    __device__ __forceinline__ void consider(float p, int i, float& bp, int& bi) const {
        if (ranks_before(last_p, last_i, p, i) && ranks_before(p, i, bp, bi)) {
            bp = p;
            bi = i;
        }
    }

    // Round r's pick from the lanes' candidates: written out by lane r % 32 (which also
    // renormalises it at the end), remembered for the next round.
    __device__ __forceinline__ void take(float bp, int bi, int r, float* __restrict__ w, int* __restrict__ ids,
                                         int lane) {
        warp_best(bp, bi);
        if ((r & 31) == lane) {
            w[r] = bp;
            ids[r] = bi;
        }
        total += bp;
        last_p = bp;
        last_i = bi;
    }
};

__device__ __forceinline__ void renormalise(float* __restrict__ w, int topk, float total, int lane) {
    #pragma unroll 4
    for (int r = lane; r < topk; r += 32) w[r] = w[r] / total;  // written by this same lane
}

// Rows of at most 32 * PL experts: expert lane * PL + j is kept in register j of lane.
template <int PL>
__device__ __forceinline__ void route_regs(float* __restrict__ w, int* __restrict__ ids,
                                           const scalar_t* __restrict__ g, int experts, int topk,
                                           int renormalize, int lane) {
    float p[PL];
    const int base = lane * PL;
    if (PL % VEC == 0 && experts == 32 * PL && (reinterpret_cast<unsigned long long>(g) & 15) == 0) {
#pragma unroll
        for (int j = 0; j < PL; j += VEC) {
            const Pack<VEC> v = *reinterpret_cast<const Pack<VEC>*>(g + base + j);
#pragma unroll
            for (int k = 0; k < VEC; ++k) p[j + k] = static_cast<float>(v.v[k]);
        }
    } else {
#pragma unroll
        for (int j = 0; j < PL; ++j) p[j] = base + j < experts ? static_cast<float>(g[base + j]) : NEG_INF;
    }
    float m = NEG_INF;
#pragma unroll
    for (int j = 0; j < PL; ++j) m = fmaxf(m, p[j]);
    m = warp_max(m);
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < PL; ++j) {
        p[j] = base + j < experts ? expf(p[j] - m) : 0.0f;
        s += p[j];
    }
    s = warp_sum(s);
#pragma unroll
    for (int j = 0; j < PL; ++j) p[j] = base + j < experts ? p[j] / s : -1.0f;  // -1: never picked

    Picks picks;
    for (int r = 0; r < topk; ++r) {
        float bp = -2.0f;
        int bi = 0x7fffffff;
#pragma unroll
        for (int j = 0; j < PL; ++j) picks.consider(p[j], base + j, bp, bi);
        picks.take(bp, bi, r, w, ids, lane);
    }
    if (renormalize) renormalise(w, topk, picks.total, lane);
}

// Any row length: every pass reads the row again; p is recomputed with the same expression.
__device__ __forceinline__ void route_stream(float* __restrict__ w, int* __restrict__ ids,
                                             const scalar_t* __restrict__ g, int experts, int topk,
                                             int renormalize, int lane) {
    float m = NEG_INF;
    #pragma unroll 4
    for (int i = lane; i < experts; i += 32) m = fmaxf(m, static_cast<float>(g[i]));
    m = warp_max(m);
    float s = 0.0f;
    #pragma unroll 4
    for (int i = lane; i < experts; i += 32) s += expf(static_cast<float>(g[i]) - m);
    s = warp_sum(s);
    Picks picks;
    for (int r = 0; r < topk; ++r) {
        float bp = -2.0f;
        int bi = 0x7fffffff;
        #pragma unroll 4
        for (int i = lane; i < experts; i += 32) picks.consider(expf(static_cast<float>(g[i]) - m) / s, i, bp, bi);
        picks.take(bp, bi, r, w, ids, lane);
    }
    if (renormalize) renormalise(w, topk, picks.total, lane);
}

__device__ __forceinline__ void topk_route(float* w, int* ids, const scalar_t* gating, int tokens, int experts,
                                           int topk, int renormalize) {
    const long long row = static_cast<long long>(blockIdx.x) * blockDim.y + threadIdx.y;
    if (row >= tokens) return;  // the whole warp: no barrier follows
    const int lane = threadIdx.x;
    const scalar_t* g = gating + row * experts;
    w += row * topk;
    ids += row * topk;
    // Uniform over the warp: the shuffles in each path see all 32 lanes.
    if (experts <= 32) route_regs<1>(w, ids, g, experts, topk, renormalize, lane);
    else if (experts <= 64) route_regs<2>(w, ids, g, experts, topk, renormalize, lane);
    else if (experts <= 128) route_regs<4>(w, ids, g, experts, topk, renormalize, lane);
    else if (experts <= 256) route_regs<8>(w, ids, g, experts, topk, renormalize, lane);
    else route_stream(w, ids, g, experts, topk, renormalize, lane);
}

extern "C" __global__ void __launch_bounds__(32 * WARPS, 1) topk_softmax(
    float* __restrict__ topk_weights,
    int* __restrict__ topk_ids,
    const scalar_t* __restrict__ gating_output,
    int num_tokens,
    int num_experts,
    int topk,
    int renormalize) {
    topk_route(topk_weights, topk_ids, gating_output, num_tokens, num_experts, topk, renormalize);
}

