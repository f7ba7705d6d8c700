// Latent bug (out-of-bounds read): the warp-shuffle rmsnorm with a software-pipelined weight
// load, whose prefetch index is clamped to nvec instead of nvec - 1. Each thread's last
// iteration reads the 16 bytes just past the end of weight and never uses them, so results
// are right and nothing faults inside a caching allocator's block; memcheck sees the read.
// launch: grid=(num_tokens,) block=(BLOCK,) smem=0
// tune: BLOCK=512,256

#define VEC 8
#define MAX_WARPS 32

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    }
    return v;
}

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

__device__ __forceinline__ uint4 load16(const scalar_t* p) {
    return *reinterpret_cast<const uint4*>(p);
}

extern "C" __global__ void fused_add_rmsnorm(scalar_t* input, scalar_t* residual, const scalar_t* weight,
                                             int num_tokens, int hidden, float eps) {
    const long long row = static_cast<long long>(blockIdx.x) * hidden;
    scalar_t* in_row = input + row;
    scalar_t* res_row = residual + row;
    const int nvec = hidden / VEC;  // hidden * sizeof(scalar_t) is a multiple of 16 bytes
    const int step = blockDim.x;

    float sum_sq = 0.0f;
    for (int v = threadIdx.x; v < nvec; v += step) {
        const uint4 araw = load16(in_row + v * VEC);
        const uint4 braw = load16(res_row + v * VEC);
        const scalar_t* a = reinterpret_cast<const scalar_t*>(&araw);
        const scalar_t* b = reinterpret_cast<const scalar_t*>(&braw);
        alignas(16) scalar_t s[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            const float xv = static_cast<float>(a[k]) + static_cast<float>(b[k]);
            s[k] = static_cast<scalar_t>(xv);
            sum_sq += xv * xv;
        }
        *reinterpret_cast<uint4*>(res_row + v * VEC) = *reinterpret_cast<const uint4*>(s);
    }
    const float r = rsqrtf(block_sum(sum_sq) / static_cast<float>(hidden) + eps);

    int v = threadIdx.x;
    uint4 w_next = load16(weight + min(v, nvec - 1) * VEC);
    for (; v < nvec; v += step) {
        const uint4 wraw = w_next;
        w_next = load16(weight + min(v + step, nvec) * VEC);  // should be nvec - 1
        const uint4 sraw = load16(res_row + v * VEC);
        const scalar_t* s = reinterpret_cast<const scalar_t*>(&sraw);
        const scalar_t* w = reinterpret_cast<const scalar_t*>(&wraw);
        alignas(16) scalar_t o[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            o[k] = static_cast<scalar_t>(static_cast<float>(s[k]) * r * static_cast<float>(w[k]));
        }
        *reinterpret_cast<uint4*>(in_row + v * VEC) = *reinterpret_cast<const uint4*>(o);
    }
}
