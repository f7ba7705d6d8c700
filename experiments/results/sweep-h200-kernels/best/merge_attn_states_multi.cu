// merge_attn_states_multi: merge num_states partial attention states by their base-2 log-sum-exp, per
// (token, head): m = max_p lse_p; w_p = 2^(lse_p - m); out = sum_p w_p v_p / sum_p w_p;
// lse = log2(sum_p w_p) + m; all states empty (-inf) gives out = 0, lse = -inf.
// Recipe merge_multi/flat: head_dim is split into 16-byte vectors (8 halves) and the whole
// [tokens, heads, head_dim / 8] range is one flat index space, one vector per thread, so a
// block spans several heads instead of one block per (token, head). Every thread issues the
// loads of UNROLL states (their lse and their vector) before using any of them: the merge
// costs a few round trips to memory, not one per state. A scalar path covers other element
// types, head_dim not a multiple of 8 and unaligned pointers.
// launch: grid=(cdiv(num_tokens * num_heads * cdiv(head_dim, 8), BLOCK),) block=(BLOCK,) smem=0
// flags: --use_fast_math
// tune: BLOCK=256,128,512
// tune: UNROLL=4,2,8
#ifndef BLOCK
#define BLOCK 256
#endif
#ifndef UNROLL
#define UNROLL 4
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


__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000u); }

// Max lse of one (token, head) over the states, UNROLL loads in flight at a time.
__device__ __forceinline__ float max_lse(const float* __restrict__ lse, long long th, long long stride, int states) {
    float m = neg_inf();
    for (int p0 = 0; p0 < states; p0 += UNROLL) {
        float l[UNROLL];
#pragma unroll
        for (int k = 0; k < UNROLL; ++k) l[k] = p0 + k < states ? lse[(p0 + k) * stride + th] : neg_inf();
#pragma unroll
        for (int k = 0; k < UNROLL; ++k) m = fmaxf(m, l[k]);
    }
    return m;
}

__device__ __forceinline__ void merge_vectors(scalar_t* __restrict__ v_out, float* __restrict__ lse_out,
                                              const scalar_t* __restrict__ v, const float* __restrict__ lse,
                                              int states, long long pairs, int head_dim) {
    using P = Pack<8>;
    const int per_pair = head_dim / 8;
    const long long i = static_cast<long long>(blockIdx.x) * BLOCK + threadIdx.x;
    if (i >= pairs * per_pair) return;  // no barrier in this kernel
    const long long th = i / per_pair;  // token * heads + head
    const int c = static_cast<int>(i - th * per_pair);
    const long long stride = pairs;  // between states, in (token, head) pairs
    P* dst = reinterpret_cast<P*>(v_out + th * head_dim) + c;
    // The first UNROLL states' vectors are loaded with their lse, before the max is known: the
    // max needs every lse, and loading the vectors only after it made two trips to memory one
    // after the other where one does (nvdisasm, sm_90) when states <= UNROLL.
    float l0[UNROLL];
    P x0[UNROLL];
#pragma unroll
    for (int k = 0; k < UNROLL; ++k) {
        l0[k] = neg_inf();
        if (k < states) {
            const long long row = k * stride + th;
            l0[k] = lse[row];
            x0[k] = reinterpret_cast<const P*>(v + row * head_dim)[c];
        }
    }
    float m = neg_inf();
#pragma unroll
    for (int k = 0; k < UNROLL; ++k) m = fmaxf(m, l0[k]);
    if (states > UNROLL) m = fmaxf(m, max_lse(lse + UNROLL * stride, th, stride, states - UNROLL));
    if (m == neg_inf()) {
        P z;
#pragma unroll
        for (int j = 0; j < 8; ++j) z.v[j] = static_cast<scalar_t>(0.0f);
        *dst = z;
        if (c == 0) lse_out[th] = neg_inf();
        return;
    }
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < UNROLL; ++k) {
        if (k < states) {
            const float w = exp2f(l0[k] - m);  // exactly 0 for an empty state
            s += w;
#pragma unroll
            for (int j = 0; j < 8; ++j) acc[j] += w * static_cast<float>(x0[k].v[j]);
        }
    }
    for (int p0 = UNROLL; p0 < states; p0 += UNROLL) {
        float l[UNROLL];
        P x[UNROLL];
#pragma unroll
        for (int k = 0; k < UNROLL; ++k) {
            if (p0 + k < states) {
                const long long row = (p0 + k) * stride + th;
                l[k] = lse[row];
                x[k] = reinterpret_cast<const P*>(v + row * head_dim)[c];
            }
        }
#pragma unroll
        for (int k = 0; k < UNROLL; ++k) {
            if (p0 + k < states) {
                const float w = exp2f(l[k] - m);
                s += w;
#pragma unroll
                for (int j = 0; j < 8; ++j) acc[j] += w * static_cast<float>(x[k].v[j]);
            }
        }
    }
    P o;
#pragma unroll
    for (int j = 0; j < 8; ++j) o.v[j] = static_cast<scalar_t>(acc[j] / s);
    *dst = o;
    if (c == 0) lse_out[th] = log2f(s) + m;
}

// The scalar path (rare) out of line: inline, the compiler laid it before the vector path,
// so every launch jumped over its code (nvdisasm, sm_90).
__device__ __noinline__ void merge_scalar(scalar_t* __restrict__ v_out, float* __restrict__ lse_out,
                                          const scalar_t* __restrict__ v, const float* __restrict__ lse,
                                          int states, long long pairs, int head_dim) {
    const long long total = pairs * head_dim;
    for (long long e = static_cast<long long>(blockIdx.x) * BLOCK + threadIdx.x; e < total;
         e += static_cast<long long>(gridDim.x) * BLOCK) {
        const long long th = e / head_dim;
        const int d = static_cast<int>(e - th * head_dim);
        const float m = max_lse(lse, th, pairs, states);
        if (m == neg_inf()) {
            v_out[e] = static_cast<scalar_t>(0.0f);
            if (d == 0) lse_out[th] = neg_inf();
            continue;
        }
        float acc = 0.0f, s = 0.0f;
        #pragma unroll 4
        for (int p = 0; p < states; ++p) {
            const long long row = p * pairs + th;
            const float w = exp2f(lse[row] - m);
            s += w;
            acc += w * static_cast<float>(v[row * head_dim + d]);
        }
        v_out[e] = static_cast<scalar_t>(acc / s);
        if (d == 0) lse_out[th] = log2f(s) + m;
    }
}

__device__ __forceinline__ void merge_multi(scalar_t* v_out, float* lse_out, const scalar_t* v, const float* lse,
                                            int states, int tokens, int heads, int head_dim) {
    const long long pairs = static_cast<long long>(tokens) * heads;
    const unsigned long long addr = reinterpret_cast<unsigned long long>(v_out) | reinterpret_cast<unsigned long long>(v);
    // The grid counts 8-element vectors: other element types take the scalar path.
    if (VEC == 8 && head_dim % 8 == 0 && (addr & 15) == 0) {
        merge_vectors(v_out, lse_out, v, lse, states, pairs, head_dim);
    } else {
        merge_scalar(v_out, lse_out, v, lse, states, pairs, head_dim);
    }
}

extern "C" __global__ void __launch_bounds__(BLOCK, 1) merge_attn_states_multi(
    scalar_t* __restrict__ v_out,
    float* __restrict__ lse_out,
    const scalar_t* __restrict__ v,
    const float* __restrict__ lse,
    int num_states,
    int num_tokens,
    int num_heads,
    int head_dim) {
    merge_multi(v_out, lse_out, v, lse, num_states, num_tokens, num_heads, head_dim);
}

