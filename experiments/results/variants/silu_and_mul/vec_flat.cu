// silu_and_mul, vectorised: a flat grid with one 16-byte vector (8 outputs) per thread, so
// small token counts still spread over every SM; 16-byte loads of gate and up and a 16-byte
// store; silu with __expf and a correctly rounded reciprocal (exact 0 when exp overflows).
// d not a multiple of 8 (rows not 16-byte aligned) takes a scalar path.
// launch: grid=(cdiv(num_tokens * d, BLOCK * 8),) block=(BLOCK,) smem=0
// tune: BLOCK=256,128,512,64

#ifndef BLOCK
#define BLOCK 256
#endif
#define ELEMS 8  // outputs per thread: one 16-byte vector of a 2-byte type
static_assert(sizeof(scalar_t) * ELEMS == 16, "vector path assumes a 2-byte element type");

__device__ __forceinline__ float silu_mul(float g, float u) {
    return g * __frcp_rn(1.0f + __expf(-g)) * u;
}

extern "C" __global__ void __launch_bounds__(BLOCK)
    silu_and_mul(scalar_t* __restrict__ out, const scalar_t* __restrict__ x, int num_tokens, int d) {
    const long long total = static_cast<long long>(num_tokens) * d;
    const long long g = static_cast<long long>(blockIdx.x) * BLOCK + threadIdx.x;
    const long long e0 = g * ELEMS;
    if (e0 >= total) return;
    const unsigned long long addr_bits = reinterpret_cast<unsigned long long>(out) |
                                         reinterpret_cast<unsigned long long>(x);
    if (d % ELEMS != 0 || (addr_bits & 15) != 0) {
        for (long long e = e0; e < e0 + ELEMS && e < total; ++e) {
            const long long token = e / d;
            const long long col = e - token * d;
            const scalar_t* gate = x + token * 2 * d;
            out[e] = static_cast<scalar_t>(silu_mul(static_cast<float>(gate[col]), static_cast<float>(gate[d + col])));
        }
        return;
    }
    // 32-bit division: fewer than 2^32 vectors in any real launch.
    const unsigned int vecs_per_row = static_cast<unsigned int>(d / ELEMS);
    const unsigned int token = static_cast<unsigned int>(g) / vecs_per_row;
    const unsigned int col = static_cast<unsigned int>(g) - token * vecs_per_row;
    const uint4* gate_v = reinterpret_cast<const uint4*>(x + static_cast<long long>(token) * 2 * d);
    const uint4 gv = gate_v[col];
    const uint4 uv = gate_v[vecs_per_row + col];
    const scalar_t* eg = reinterpret_cast<const scalar_t*>(&gv);
    const scalar_t* eu = reinterpret_cast<const scalar_t*>(&uv);
    uint4 result;
    scalar_t* eo = reinterpret_cast<scalar_t*>(&result);
#pragma unroll
    for (int j = 0; j < ELEMS; ++j) {
        eo[j] = static_cast<scalar_t>(silu_mul(static_cast<float>(eg[j]), static_cast<float>(eu[j])));
    }
    reinterpret_cast<uint4*>(out)[g] = result;
}
