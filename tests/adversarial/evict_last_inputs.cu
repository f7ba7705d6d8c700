// fused_add_rmsnorm whose every vector load asks the L2 to keep the line (createpolicy
// evict_last, ld.global.L2::cache_hint): correct, and built to outlive an L2 flush that only
// writes a large buffer, so that its next timed launch reads input, residual and weight from
// the L2 instead of DRAM. The flush defeats it by giving the working set's lines normal
// priority first (evaluators.timing.Flusher); otherwise the same code as
// honest_rmsnorm_warp_shuffle.cu.
// launch: grid=(num_tokens,) block=(BLOCK,) smem=0
// tune: BLOCK=512,256,1024

#define VEC 8
#define MAX_WARPS 32

// A 16-byte load whose line the L2 is asked to evict last.
__device__ __forceinline__ uint4 load_kept(const void* p) {
    unsigned long long policy;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
    uint4 v;
    asm volatile("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p), "l"(policy));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    }
    return v;
}

// Sum over the block; blockDim.x must be a multiple of 32 (every tuned value is).
__device__ float block_sum(float v) {
    __shared__ float warp_part[MAX_WARPS];
    __shared__ float total;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    v = warp_sum(v);
    if (lane == 0) {
        warp_part[warp] = v;
    }
    __syncthreads();
    if (warp == 0) {
        float t = lane < static_cast<int>(blockDim.x >> 5) ? warp_part[lane] : 0.0f;
        t = warp_sum(t);
        if (lane == 0) {
            total = t;
        }
    }
    __syncthreads();
    return total;
}

extern "C" __global__ void fused_add_rmsnorm(scalar_t* input, scalar_t* residual, const scalar_t* weight,
                                             int num_tokens, int hidden, float eps) {
    const long long row = static_cast<long long>(blockIdx.x) * hidden;
    scalar_t* in_row = input + row;
    scalar_t* res_row = residual + row;
    const bool vectorised = hidden % VEC == 0;
    const int step = vectorised ? static_cast<int>(blockDim.x) * VEC : static_cast<int>(blockDim.x);
    const int start = vectorised ? static_cast<int>(threadIdx.x) * VEC : static_cast<int>(threadIdx.x);

    float sum_sq = 0.0f;
    for (int c = start; c < hidden; c += step) {
        if (vectorised) {
            const uint4 araw = load_kept(in_row + c);
            const uint4 braw = load_kept(res_row + c);
            const scalar_t* a = reinterpret_cast<const scalar_t*>(&araw);
            const scalar_t* b = reinterpret_cast<const scalar_t*>(&braw);
            alignas(16) scalar_t s[VEC];
#pragma unroll
            for (int k = 0; k < VEC; ++k) {
                const float xv = static_cast<float>(a[k]) + static_cast<float>(b[k]);
                s[k] = static_cast<scalar_t>(xv);
                sum_sq += xv * xv;
            }
            *reinterpret_cast<uint4*>(res_row + c) = *reinterpret_cast<const uint4*>(s);
        } else {
            const float xv = static_cast<float>(in_row[c]) + static_cast<float>(res_row[c]);
            res_row[c] = static_cast<scalar_t>(xv);
            sum_sq += xv * xv;
        }
    }
    const float r = rsqrtf(block_sum(sum_sq) / static_cast<float>(hidden) + eps);

    for (int c = start; c < hidden; c += step) {
        if (vectorised) {
            const uint4 sraw = load_kept(res_row + c);
            const uint4 wraw = load_kept(weight + c);
            const scalar_t* s = reinterpret_cast<const scalar_t*>(&sraw);
            const scalar_t* w = reinterpret_cast<const scalar_t*>(&wraw);
            alignas(16) scalar_t o[VEC];
#pragma unroll
            for (int k = 0; k < VEC; ++k) {
                o[k] = static_cast<scalar_t>(static_cast<float>(s[k]) * r * static_cast<float>(w[k]));
            }
            *reinterpret_cast<uint4*>(in_row + c) = *reinterpret_cast<const uint4*>(o);
        } else {
            in_row[c] = static_cast<scalar_t>(static_cast<float>(res_row[c]) * r * static_cast<float>(weight[c]));
        }
    }
}
