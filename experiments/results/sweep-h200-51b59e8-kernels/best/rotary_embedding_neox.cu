// rotary_embedding_neox: rotary embedding in place on query and key, pairs (i, i + rot_dim/2), with cos and sin from the
// fp32 cache row of the token's position: x' = x*cos - y*sin, y' = y*cos + x*sin.
// Recipe rotary/flat: the [tokens, query heads + key heads, units] range is one flat index
// space, one unit per thread (NeoX: 8 pairs, a 16-byte vector from each half; GPT-J: 4 pairs,
// one 16-byte vector), with 16-byte loads of cos and sin; the query and key loads are issued
// before the dependent position -> cache loads. A scalar path covers other element types,
// sizes that are not multiples of the vector and unaligned pointers.
// launch: grid=(cdiv(num_tokens * (num_heads + num_kv_heads) * cdiv(rot_dim, 16), BLOCK),) block=(BLOCK,) smem=0
// tune: BLOCK=256,128,512
#ifndef BLOCK
#define BLOCK 256
#endif

#define NEOX 1
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

// Rotated elements per thread: 8 pairs (NeoX) or 8 elements = 4 pairs (GPT-J).
constexpr int UNIT_DIV = NEOX ? 16 : 8;  // rot_dim / UNIT_DIV units per head

__device__ __forceinline__ void rotate_vector(scalar_t* __restrict__ base, const float* __restrict__ row, int u,
                                              int half) {
    using P = Pack<8>;
#if NEOX
    P* xp = reinterpret_cast<P*>(base) + u;
    P* yp = reinterpret_cast<P*>(base + half) + u;
    P x = *xp, y = *yp;
    const float4 c0 = reinterpret_cast<const float4*>(row)[2 * u];
    const float4 c1 = reinterpret_cast<const float4*>(row)[2 * u + 1];
    const float4 s0 = reinterpret_cast<const float4*>(row + half)[2 * u];
    const float4 s1 = reinterpret_cast<const float4*>(row + half)[2 * u + 1];
    const float c[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
    const float s[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        const float a = static_cast<float>(x.v[k]), b = static_cast<float>(y.v[k]);
        x.v[k] = static_cast<scalar_t>(a * c[k] - b * s[k]);
        y.v[k] = static_cast<scalar_t>(b * c[k] + a * s[k]);
    }
    *xp = x;
    *yp = y;
#else
    P* vp = reinterpret_cast<P*>(base) + u;
    P v = *vp;
    const float4 c4 = reinterpret_cast<const float4*>(row)[u];
    const float4 s4 = reinterpret_cast<const float4*>(row + half)[u];
    const float c[4] = {c4.x, c4.y, c4.z, c4.w};
    const float s[4] = {s4.x, s4.y, s4.z, s4.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const float a = static_cast<float>(v.v[2 * k]), b = static_cast<float>(v.v[2 * k + 1]);
        v.v[2 * k] = static_cast<scalar_t>(a * c[k] - b * s[k]);
        v.v[2 * k + 1] = static_cast<scalar_t>(b * c[k] + a * s[k]);
    }
    *vp = v;
#endif
}

__device__ __forceinline__ scalar_t* head_base(scalar_t* query, scalar_t* key, long long token, int head, int heads,
                                               int kv_heads, int head_size) {
    return head < heads ? query + (token * heads + head) * head_size
                        : key + (token * kv_heads + (head - heads)) * head_size;
}

// The scalar path (rare) out of line: inline, the compiler laid it before the vector path,
// so every launch jumped over its code (nvdisasm, sm_90).
__device__ __noinline__ void rotary_scalar(const long long* positions, scalar_t* query, scalar_t* key,
                                           const float* cos_sin_cache, int tokens, int heads, int kv_heads,
                                           int head_size, int rot_dim) {
    const int half = rot_dim / 2;
    const int all_heads = heads + kv_heads;
    const long long total = static_cast<long long>(tokens) * all_heads * half;
    #pragma unroll 4
    for (long long p = static_cast<long long>(blockIdx.x) * BLOCK + threadIdx.x; p < total;
         p += static_cast<long long>(gridDim.x) * BLOCK) {
        const long long token = p / (static_cast<long long>(all_heads) * half);
        const int rem = static_cast<int>(p - token * all_heads * half);
        const int head = rem / half;
        const int j = rem - head * half;
        scalar_t* base = head_base(query, key, token, head, heads, kv_heads, head_size);
        const float* row = cos_sin_cache + positions[token] * rot_dim;
        const int ia = NEOX ? j : 2 * j;
        const int ib = NEOX ? j + half : 2 * j + 1;
        const float c = row[j], s = row[half + j];
        const float a = static_cast<float>(base[ia]), b = static_cast<float>(base[ib]);
        base[ia] = static_cast<scalar_t>(a * c - b * s);
        base[ib] = static_cast<scalar_t>(b * c + a * s);
    }
}

__device__ __forceinline__ void rotary(const long long* positions, scalar_t* query, scalar_t* key,
                                       const float* cos_sin_cache, int tokens, int heads, int kv_heads,
                                       int head_size, int rot_dim) {
    const int half = rot_dim / 2;
    const int all_heads = heads + kv_heads;
    const unsigned long long addr = reinterpret_cast<unsigned long long>(query) | reinterpret_cast<unsigned long long>(key) |
                                    reinterpret_cast<unsigned long long>(cos_sin_cache);
    // Every vector of a head starts on 16 bytes: head_size and rot_dim multiples of the unit.
    if (VEC == 8 && rot_dim % UNIT_DIV == 0 && head_size % 8 == 0 && (addr & 15) == 0) {
        const int units = rot_dim / UNIT_DIV;
        const long long i = static_cast<long long>(blockIdx.x) * BLOCK + threadIdx.x;
        if (i >= static_cast<long long>(tokens) * all_heads * units) return;  // no barrier here
        const long long token = i / (all_heads * units);
        const int rem = static_cast<int>(i - token * all_heads * units);
        const int head = rem / units;
        const int u = rem - head * units;
        rotate_vector(head_base(query, key, token, head, heads, kv_heads, head_size),
                      cos_sin_cache + positions[token] * rot_dim, u, half);
        return;
    }
    rotary_scalar(positions, query, key, cos_sin_cache, tokens, heads, kv_heads, head_size, rot_dim);
}

extern "C" __global__ void __launch_bounds__(BLOCK, 1) rotary_embedding_neox(
    const long long* __restrict__ positions,
    scalar_t* __restrict__ query,
    scalar_t* __restrict__ key,
    const float* __restrict__ cos_sin_cache,
    int num_tokens,
    int num_heads,
    int num_kv_heads,
    int head_size,
    int rot_dim,
    int max_position) {
    rotary(positions, query, key, cos_sin_cache, num_tokens, num_heads, num_kv_heads, head_size, rot_dim);
}

