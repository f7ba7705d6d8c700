// merge_attn_states_lse: merge two partial attention states by their base-2 log-sum-exp, per (token, head):
// m = max(sa, sb); wa = 2^(sa - m); wb = 2^(sb - m); out = (va * wa + vb * wb) / (wa + wb);
// lse = log2(wa + wb) + m; both states empty (-inf) gives out = 0, lse = -inf.
// Recipe merge/flat: head_dim is split into 16-byte vectors (8 halves) and the whole
// [tokens, heads, head_dim / 8] range is one flat index space, so a thread group per
// (token, head) covers head_dim and a block spans several heads; each thread keeps ITEMS
// vectors in flight. A scalar path covers head_dim not a multiple of 8 or unaligned pointers.
// launch: grid=(cdiv(num_tokens * num_heads * head_dim, min(BLOCK, max(32, 32 * cdiv(num_tokens * num_heads * head_dim, 8 * ITEMS * 32 * 264))) * 8 * ITEMS),) block=(min(BLOCK, max(32, 32 * cdiv(num_tokens * num_heads * head_dim, 8 * ITEMS * 32 * 264))),) smem=0
// flags: --use_fast_math
// tune: BLOCK=256,128,512
// tune: ITEMS=1,2,4
#ifndef BLOCK
#define BLOCK 256
#endif
#ifndef ITEMS
#define ITEMS 1
#endif

constexpr int VEC = 16 / sizeof(scalar_t);

template <int V>
struct alignas(sizeof(scalar_t) * V) Pack {
    scalar_t v[V];
};

// m = max(sa, sb); the states' weights 2^(s - m) / (2^(sa - m) + 2^(sb - m)) and the merged
// lse = log2(sum) + m; both states empty (-inf) gives weights 0 and lse -inf.
__device__ __forceinline__ void merge_weights(float sa, float sb, float& fa, float& fb, float& lse) {
    const float neg_inf = __int_as_float(0xff800000u);
    const float m = fmaxf(sa, sb);
    fa = 0.0f;
    fb = 0.0f;
    lse = neg_inf;
    if (m != neg_inf) {  // both empty: m - m would be NaN
        const float wa = exp2f(sa - m);
        const float wb = exp2f(sb - m);
        const float inv = 1.0f / (wa + wb);
        fa = wa * inv;
        fb = wb * inv;
        lse = log2f(wa + wb) + m;
    }
}


template <int V>
__device__ __forceinline__ void merge_body(scalar_t* __restrict__ v_out, float* __restrict__ s_out,
                                            const scalar_t* __restrict__ v_a, const float* __restrict__ s_a,
                                            const scalar_t* __restrict__ v_b, const float* __restrict__ s_b,
                                            long long pairs, int head_dim) {
    using P = Pack<V>;
    const int per_pair = head_dim / V;
    const long long total = pairs * per_pair;
    // blockDim.x is BLOCK, or fewer on a launch too small to give every SM a block.
    const int nt = blockDim.x;
    const long long step = static_cast<long long>(gridDim.x) * nt * ITEMS;
    for (long long first = static_cast<long long>(blockIdx.x) * nt * ITEMS + threadIdx.x; first < total; first += step) {
        P a[ITEMS], b[ITEMS];
#pragma unroll
        for (int k = 0; k < ITEMS; ++k) {
            const long long i = first + static_cast<long long>(k) * nt;
            if (i < total) {
                a[k] = reinterpret_cast<const P*>(v_a)[i];
                b[k] = reinterpret_cast<const P*>(v_b)[i];
            }
        }
#pragma unroll
        for (int k = 0; k < ITEMS; ++k) {
            const long long i = first + static_cast<long long>(k) * nt;
            if (i >= total) continue;
            const long long pair = i / per_pair;
            const float sa = s_a[pair];
            const float sb = s_b[pair];
            float fa, fb, lse;
            merge_weights(sa, sb, fa, fb, lse);
            P o;
#pragma unroll
            for (int j = 0; j < V; ++j) {
                o.v[j] = static_cast<scalar_t>(static_cast<float>(a[k].v[j]) * fa + static_cast<float>(b[k].v[j]) * fb);
            }
            reinterpret_cast<P*>(v_out)[i] = o;
            if (i == pair * per_pair) s_out[pair] = lse;
        }
    }
}


// The element-by-element path (rare) out of line: inline, the compiler laid it before the
// vector path, so every launch jumped over its code (nvdisasm, sm_90).
__device__ __noinline__ void merge_body_scalar(scalar_t* __restrict__ v_out, float* __restrict__ s_out,
                                               const scalar_t* __restrict__ v_a, const float* __restrict__ s_a,
                                               const scalar_t* __restrict__ v_b, const float* __restrict__ s_b,
                                               long long pairs, int head_dim) {
    merge_body<1>(v_out, s_out, v_a, s_a, v_b, s_b, pairs, head_dim);
}

__device__ __forceinline__ void merge_states(scalar_t* v_out, float* s_out, const scalar_t* v_a, const float* s_a,
                                             const scalar_t* v_b, const float* s_b, int tokens, int heads,
                                             int head_dim) {
    const long long pairs = static_cast<long long>(tokens) * heads;
    const unsigned long long addr = reinterpret_cast<unsigned long long>(v_out) | reinterpret_cast<unsigned long long>(v_a) |
                                    reinterpret_cast<unsigned long long>(v_b);
    if (head_dim % VEC == 0 && (addr & 15) == 0) {
        merge_body<VEC>(v_out, s_out, v_a, s_a, v_b, s_b, pairs, head_dim);
    } else {
        merge_body_scalar(v_out, s_out, v_a, s_a, v_b, s_b, pairs, head_dim);
    }
}

extern "C" __global__ void __launch_bounds__(BLOCK, 1) merge_attn_states_lse(
    scalar_t* __restrict__ v_out,
    float* __restrict__ s_out,
    const scalar_t* __restrict__ v_a,
    const float* __restrict__ s_a,
    const scalar_t* __restrict__ v_b,
    const float* __restrict__ s_b,
    int num_tokens,
    int num_heads,
    int head_dim) {
    merge_states(v_out, s_out, v_a, s_a, v_b, s_b, num_tokens, num_heads, head_dim);
}

