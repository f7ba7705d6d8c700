// Honest fast merge_attn_states_lse: a flat grid over 8-element (16-byte) vectors of v_out,
// so one token spreads over many blocks; per vector the head's two lse values are read once
// and both weights computed in fp32 (exp2f, log2f for the merged lse). Both states empty
// (lse -inf on both sides) gives v_out = 0 and s_out = -inf, as the spec defines.
// launch: grid=(cdiv(num_tokens * num_heads * head_dim, 8 * BLOCK),) block=(BLOCK,) smem=0
// tune: BLOCK=256,128,512

#define VEC 8

struct Weights {
    float wa;
    float wb;
    float lse;
};

__device__ __forceinline__ Weights merge_weights(float sa, float sb) {
    const float neg_inf = __int_as_float(0xff800000u);
    const float m = fmaxf(sa, sb);
    if (m == neg_inf) {
        return {0.0f, 0.0f, neg_inf};
    }
    const float ea = exp2f(sa - m);
    const float eb = exp2f(sb - m);
    const float total = ea + eb;
    return {ea / total, eb / total, log2f(total) + m};
}

extern "C" __global__ void merge_attn_states_lse(scalar_t* v_out, float* s_out, const scalar_t* v_a,
                                                 const float* s_a, const scalar_t* v_b, const float* s_b,
                                                 int num_tokens, int num_heads, int head_dim) {
    const long long pairs = static_cast<long long>(num_tokens) * num_heads;
    const long long total = pairs * head_dim;
    const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
    const long long first = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (head_dim % VEC == 0) {
        const long long head_vecs = head_dim / VEC;
        for (long long v = first; v < total / VEC; v += stride) {
            const long long pair = v / head_vecs;
            const long long at = v * VEC;
            const Weights w = merge_weights(s_a[pair], s_b[pair]);
            const uint4 araw = *reinterpret_cast<const uint4*>(v_a + at);
            const uint4 braw = *reinterpret_cast<const uint4*>(v_b + at);
            const scalar_t* a = reinterpret_cast<const scalar_t*>(&araw);
            const scalar_t* b = reinterpret_cast<const scalar_t*>(&braw);
            alignas(16) scalar_t o[VEC];
#pragma unroll
            for (int k = 0; k < VEC; ++k) {
                o[k] = static_cast<scalar_t>(static_cast<float>(a[k]) * w.wa + static_cast<float>(b[k]) * w.wb);
            }
            *reinterpret_cast<uint4*>(v_out + at) = *reinterpret_cast<const uint4*>(o);
            if (v == pair * head_vecs) {
                s_out[pair] = w.lse;
            }
        }
    } else {
        for (long long i = first; i < total; i += stride) {
            const long long pair = i / head_dim;
            const Weights w = merge_weights(s_a[pair], s_b[pair]);
            v_out[i] = static_cast<scalar_t>(static_cast<float>(v_a[i]) * w.wa + static_cast<float>(v_b[i]) * w.wb);
            if (i == pair * head_dim) {
                s_out[pair] = w.lse;
            }
        }
    }
}
