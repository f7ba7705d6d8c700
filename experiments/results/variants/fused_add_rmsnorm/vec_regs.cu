// fused_add_rmsnorm, vectorised: one block per row; 16-byte loads and stores; each thread
// keeps its part of the row in registers (as the rounded residual it also stores) between the
// two passes, so the second pass reads only the weight; fp32 sum of squares reduced with warp
// shuffles and one cross-warp step. Rows longer than the register cache re-read the residual
// of the uncached tail; rows whose width is not a multiple of 16 bytes take a scalar path.
// launch: grid=(num_tokens,) block=(BLOCK,) smem=0
// tune: BLOCK=256,512,1024,128

#ifndef BLOCK
#define BLOCK 256
#endif
// 16-byte vectors cached per thread: hidden = 18432 fits at 512 and 1024 threads; the cache
// shrinks as the block grows so that 1024-thread blocks stay within 64 registers.
#ifndef CACHED
#define CACHED (BLOCK >= 1024 ? 3 : (BLOCK >= 512 ? 5 : 8))
#endif

constexpr int VEC = 16 / sizeof(scalar_t);
static_assert(BLOCK % 32 == 0 && BLOCK <= 1024, "BLOCK must be a multiple of 32, at most 1024");

__device__ __forceinline__ float block_sum(float v, float* warp_sums) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    if (lane == 0) warp_sums[threadIdx.x >> 5] = v;
    __syncthreads();
    // Every warp sums the per-warp partials itself: no second barrier to broadcast the total.
    v = lane < BLOCK / 32 ? warp_sums[lane] : 0.0f;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// x = a + b in fp32; returns T(x) packed and adds the unrounded x^2 to sum_sq.
__device__ __forceinline__ uint4 add_pack(uint4 a, uint4 b, float& sum_sq) {
    const scalar_t* ea = reinterpret_cast<const scalar_t*>(&a);
    const scalar_t* eb = reinterpret_cast<const scalar_t*>(&b);
    uint4 out;
    scalar_t* eo = reinterpret_cast<scalar_t*>(&out);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
        const float x = static_cast<float>(ea[j]) + static_cast<float>(eb[j]);
        eo[j] = static_cast<scalar_t>(x);
        sum_sq += x * x;
    }
    return out;
}

__device__ __forceinline__ uint4 scale_pack(uint4 x, uint4 w, float r) {
    const scalar_t* ex = reinterpret_cast<const scalar_t*>(&x);
    const scalar_t* ew = reinterpret_cast<const scalar_t*>(&w);
    uint4 out;
    scalar_t* eo = reinterpret_cast<scalar_t*>(&out);
#pragma unroll
    for (int j = 0; j < VEC; ++j) eo[j] = static_cast<scalar_t>(static_cast<float>(ex[j]) * r * static_cast<float>(ew[j]));
    return out;
}

// Fallback for rows that cannot be read as 16-byte vectors (width or alignment).
__device__ void scalar_row(scalar_t* in_row, scalar_t* res_row, const scalar_t* weight, int hidden, float eps,
                           float* warp_sums) {
    float sum_sq = 0.0f;
    for (int i = threadIdx.x; i < hidden; i += BLOCK) {
        const float x = static_cast<float>(in_row[i]) + static_cast<float>(res_row[i]);
        res_row[i] = static_cast<scalar_t>(x);
        sum_sq += x * x;
    }
    const float r = rsqrtf(block_sum(sum_sq, warp_sums) / static_cast<float>(hidden) + eps);
    for (int i = threadIdx.x; i < hidden; i += BLOCK) {
        in_row[i] = static_cast<scalar_t>(static_cast<float>(res_row[i]) * r * static_cast<float>(weight[i]));
    }
}

extern "C" __global__ void __launch_bounds__(BLOCK)
    fused_add_rmsnorm(scalar_t* __restrict__ input, scalar_t* __restrict__ residual,
                      const scalar_t* __restrict__ weight, int num_tokens, int hidden, float eps) {
    __shared__ float warp_sums[BLOCK / 32];
    const long long row = static_cast<long long>(blockIdx.x) * hidden;
    const unsigned long long addr_bits = reinterpret_cast<unsigned long long>(input) |
                                         reinterpret_cast<unsigned long long>(residual) |
                                         reinterpret_cast<unsigned long long>(weight);
    if (hidden % VEC != 0 || (addr_bits & 15) != 0) {  // uniform over the block
        scalar_row(input + row, residual + row, weight, hidden, eps, warp_sums);
        return;
    }
    uint4* in_v = reinterpret_cast<uint4*>(input + row);
    uint4* res_v = reinterpret_cast<uint4*>(residual + row);
    const uint4* w_v = reinterpret_cast<const uint4*>(weight);
    const int nvec = hidden / VEC;

    uint4 cache[CACHED];
    float sum_sq = 0.0f;
#pragma unroll
    for (int k = 0; k < CACHED; ++k) {
        const int i = threadIdx.x + k * BLOCK;
        cache[k] = make_uint4(0u, 0u, 0u, 0u);
        if (i < nvec) {
            cache[k] = add_pack(in_v[i], res_v[i], sum_sq);
            res_v[i] = cache[k];
        }
    }
    for (int i = threadIdx.x + CACHED * BLOCK; i < nvec; i += BLOCK) {
        res_v[i] = add_pack(in_v[i], res_v[i], sum_sq);
    }
    const float r = rsqrtf(block_sum(sum_sq, warp_sums) / static_cast<float>(hidden) + eps);

#pragma unroll
    for (int k = 0; k < CACHED; ++k) {
        const int i = threadIdx.x + k * BLOCK;
        if (i < nvec) in_v[i] = scale_pack(cache[k], w_v[i], r);
    }
    // The uncached tail: each thread reads back only residual vectors it wrote itself.
    for (int i = threadIdx.x + CACHED * BLOCK; i < nvec; i += BLOCK) {
        in_v[i] = scale_pack(res_v[i], w_v[i], r);
    }
}
