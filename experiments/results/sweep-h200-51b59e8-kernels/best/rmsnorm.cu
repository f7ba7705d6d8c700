// rmsnorm: generated from the traced reference (rows/block: one row per block of threads sized to the row, short rows several to a block; ITEMS vectors per thread kept in registers between passes, fp32 accumulation).
// launch: grid=(cdiv(num_tokens, max(1, min(256 // min(512, 32 * cdiv(hidden, 256 * ITEMS) - 16 * min(1, max(0, 128 * ITEMS + 1 - hidden)) - 8 * min(1, max(0, 64 * ITEMS + 1 - hidden)) - 4 * min(1, max(0, 32 * ITEMS + 1 - hidden))), cdiv(num_tokens, 264)))),) block=(min(512, 32 * cdiv(hidden, 256 * ITEMS) - 16 * min(1, max(0, 128 * ITEMS + 1 - hidden)) - 8 * min(1, max(0, 64 * ITEMS + 1 - hidden)) - 4 * min(1, max(0, 32 * ITEMS + 1 - hidden))), max(1, min(256 // min(512, 32 * cdiv(hidden, 256 * ITEMS) - 16 * min(1, max(0, 128 * ITEMS + 1 - hidden)) - 8 * min(1, max(0, 64 * ITEMS + 1 - hidden)) - 4 * min(1, max(0, 32 * ITEMS + 1 - hidden))), cdiv(num_tokens, 264)))) smem=0
// tune: ITEMS=4,2,8,1
// tune: RU=1,2,4
#ifndef ITEMS
#define ITEMS 4
#endif
#ifndef RU
#define RU 1
#endif
constexpr int VEC = 16 / sizeof(scalar_t);

// The type of element indices and sizes. A schedule that proves at launch that every index
// fits 32 bits runs a copy of its code with int instead (a template parameter of that name
// hides this one): 64-bit index arithmetic took ~10% of a short elementwise thread.
typedef long long cg_idx;

// V elements of T, aligned for one (or, past 16 bytes, several) wide loads.
template <typename T, int V>
struct alignas(sizeof(T) * V >= 16 ? 16 : sizeof(T) * V) Pack {
    T v[V];
};

// Stores a pack with one vector store. Assigned as a struct, a pack of 2-byte elements came out
// of the compiler as 2- and 4-byte stores (read in the PTX of the elementwise and transpose
// schedules), even 16-byte aligned; the __stwb intrinsics are single vector stores with the
// default (write-back) cache policy, fed with 32-bit words built from the elements' bits.
template <typename T, int V>
__device__ __forceinline__ void cg_store(T* p, const Pack<T, V>& x) {
    constexpr int S = static_cast<int>(sizeof(T)), B = S * V;
    if constexpr (S <= 4 && 4 % S == 0 && B % 4 == 0 && (B <= 8 || B % 16 == 0)) {
        constexpr int PER = 4 / S;  // elements per word
        unsigned int w[B / 4];
#pragma unroll
        for (int k = 0; k < B / 4; ++k) {
            w[k] = 0u;
#pragma unroll
            for (int j = 0; j < PER; ++j) {
                unsigned int bits = 0u;
                memcpy(&bits, &x.v[k * PER + j], S);
                w[k] |= bits << (8 * S * j);
            }
        }
        if constexpr (B % 16 == 0) {
#pragma unroll
            for (int k = 0; k < B / 16; ++k) {
                __stwb(reinterpret_cast<uint4*>(p) + k, make_uint4(w[4 * k], w[4 * k + 1], w[4 * k + 2], w[4 * k + 3]));
            }
        } else if constexpr (B == 8) {
            __stwb(reinterpret_cast<uint2*>(p), make_uint2(w[0], w[1]));
        } else {
            __stwb(reinterpret_cast<unsigned int*>(p), w[0]);
        }
    } else {
        *reinterpret_cast<Pack<T, V>*>(p) = x;
    }
}

// Maximum and minimum that keep NaN, as torch does (fmaxf would drop it).
__device__ __forceinline__ float cg_max(float a, float b) { return (a != a || b != b) ? a + b : fmaxf(a, b); }
__device__ __forceinline__ float cg_min(float a, float b) { return (a != a || b != b) ? a + b : fminf(a, b); }
__device__ __forceinline__ float cg_relu(float a) { return a != a ? a : fmaxf(a, 0.0f); }

__device__ __forceinline__ bool cg_aligned(const void* p, unsigned bytes) {
    return (reinterpret_cast<unsigned long long>(p) & (bytes - 1)) == 0;
}

template <int OP>
__device__ __forceinline__ float cg_combine(float a, float b) {
    return OP == 0 ? a + b : (OP == 1 ? cg_max(a, b) : cg_min(a, b));
}

template <int OP>
__device__ __forceinline__ float cg_warp_reduce(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = cg_combine<OP>(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// As cg_warp_reduce over the blockDim.x lanes of one row: a row narrower than a warp (4, 8 or 16
// threads) shares the warp with the next rows, and the butterfly stays inside its lanes.
template <int OP>
__device__ __forceinline__ float cg_row_warp_reduce(float v) {
    if (blockDim.x >= 32) return cg_warp_reduce<OP>(v);
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) {
        if (o < static_cast<int>(blockDim.x)) v = cg_combine<OP>(v, __shfl_xor_sync(0xffffffffu, v, o));
    }
    return v;
}

// Reduces over the blockDim.x threads of one row (threadIdx.y): every thread gets the result.
// Called by every thread of the block (rows past the end too), so the barriers are uniform.
template <int OP>
__device__ __forceinline__ float cg_group_reduce(float v, float identity) {
    __shared__ float part[32][33];
    v = cg_row_warp_reduce<OP>(v);
    if (blockDim.x > 32) {
        const int lane = threadIdx.x & 31;
        __syncthreads();  // the previous reduction's reads of part are done
        if (lane == 0) part[threadIdx.y][threadIdx.x >> 5] = v;
        __syncthreads();
        v = lane < static_cast<int>(blockDim.x >> 5) ? part[threadIdx.y][lane] : identity;
        v = cg_warp_reduce<OP>(v);
    }
    return v;
}

template <int V>
__device__ __forceinline__ void cg_run(scalar_t* __restrict__ out, const scalar_t* __restrict__ input, const scalar_t* __restrict__ weight, int num_tokens, int hidden, float eps) {
    const long long cg_cols = (static_cast<cg_idx>(hidden));
    const long long cg_r = static_cast<long long>(blockIdx.x) * blockDim.y + threadIdx.y;
    // Threads of rows past the end still take part in the block's barriers.
    const bool cg_active = cg_r < (static_cast<cg_idx>(num_tokens));
    const int cg_lane = threadIdx.x;
    const int cg_g = blockDim.x;
    const long long cg_row = cg_active ? cg_r : 0;
    const long long cg_obase = cg_row * cg_cols;
    const long long cg_nvec = cg_cols / V;
    const cg_idx cg_base0 = cg_row * (static_cast<cg_idx>(hidden)) + (static_cast<cg_idx>(0));
    Pack<scalar_t, V> cg_cache0[ITEMS];
    float cg_acc0 = 0.0f;
    #pragma unroll
    for (int cg_j = 0; cg_j < ITEMS; ++cg_j) {
        const cg_idx cg_c = (cg_lane + static_cast<long long>(cg_j) * cg_g) * V;
        if (cg_active && cg_lane + static_cast<long long>(cg_j) * cg_g < cg_nvec) {
            cg_cache0[cg_j] = *reinterpret_cast<const Pack<scalar_t, V>*>(input + cg_base0 + cg_c);
        }
    }
    #pragma unroll
    for (int cg_j = 0; cg_j < ITEMS; ++cg_j) {
        const cg_idx cg_c = (cg_lane + static_cast<long long>(cg_j) * cg_g) * V;
        if (cg_active && cg_lane + static_cast<long long>(cg_j) * cg_g < cg_nvec) {
            #pragma unroll
            for (int e = 0; e < V; ++e) {
                const float cg_t1 = (static_cast<float>(cg_cache0[cg_j].v[e]) * static_cast<float>(cg_cache0[cg_j].v[e]));
                cg_acc0 = cg_combine<0>(cg_acc0, static_cast<float>(cg_t1));
            }
        }
    }
    for (long long cg_i0 = cg_lane + static_cast<long long>(ITEMS) * cg_g; cg_active && cg_i0 < cg_nvec; cg_i0 += RU * cg_g) {
        Pack<scalar_t, V> cg_sp0[RU];
        #pragma unroll
        for (int cg_u = 0; cg_u < RU; ++cg_u) {
            const cg_idx cg_c = (cg_i0 + static_cast<long long>(cg_u) * cg_g) * V;
            if (cg_i0 + static_cast<long long>(cg_u) * cg_g < cg_nvec) {
                cg_sp0[cg_u] = *reinterpret_cast<const Pack<scalar_t, V>*>(input + cg_base0 + cg_c);
            }
        }
        #pragma unroll
        for (int cg_u = 0; cg_u < RU; ++cg_u) {
            const cg_idx cg_c = (cg_i0 + static_cast<long long>(cg_u) * cg_g) * V;
            if (cg_i0 + static_cast<long long>(cg_u) * cg_g < cg_nvec) {
                #pragma unroll
                for (int e = 0; e < V; ++e) {
                    const float cg_t2 = (static_cast<float>(cg_sp0[cg_u].v[e]) * static_cast<float>(cg_sp0[cg_u].v[e]));
                    cg_acc0 = cg_combine<0>(cg_acc0, static_cast<float>(cg_t2));
                }
            }
        }
    }
    const float cg_red0 = cg_group_reduce<0>(cg_acc0, 0.0f);
    const float cg_t3 = static_cast<float>(static_cast<float>((static_cast<cg_idx>(hidden))));
    const float cg_t4 = (static_cast<float>(cg_red0) / static_cast<float>(cg_t3));
    const float cg_t5 = (static_cast<float>(cg_t4) + static_cast<float>(eps));
    const float cg_t6 = rsqrtf(cg_t5);
    #pragma unroll
    for (int cg_j = 0; cg_j < ITEMS; ++cg_j) {
        const cg_idx cg_c = (cg_lane + static_cast<long long>(cg_j) * cg_g) * V;
        if (cg_active && cg_lane + static_cast<long long>(cg_j) * cg_g < cg_nvec) {
            const Pack<scalar_t, V> cg_c0 = *reinterpret_cast<const Pack<scalar_t, V>*>(weight + cg_c);
            Pack<scalar_t, V> cg_o_out;
            #pragma unroll
            for (int e = 0; e < V; ++e) {
                const float cg_t7 = (static_cast<float>(static_cast<float>(cg_cache0[cg_j].v[e])) * static_cast<float>(cg_t6));
                const float cg_t8 = (static_cast<float>(cg_t7) * static_cast<float>(static_cast<float>(cg_c0.v[e])));
                cg_o_out.v[e] = static_cast<scalar_t>(static_cast<float>(cg_t8));
            }
            cg_store<scalar_t, V>(out + cg_obase + cg_c, cg_o_out);
        }
    }
    for (long long cg_i0 = cg_lane + static_cast<long long>(ITEMS) * cg_g; cg_active && cg_i0 < cg_nvec; cg_i0 += RU * cg_g) {
        Pack<scalar_t, V> cg_sc0[RU];
        Pack<scalar_t, V> cg_sp0[RU];
        #pragma unroll
        for (int cg_u = 0; cg_u < RU; ++cg_u) {
            const cg_idx cg_c = (cg_i0 + static_cast<long long>(cg_u) * cg_g) * V;
            if (cg_i0 + static_cast<long long>(cg_u) * cg_g < cg_nvec) {
                cg_sc0[cg_u] = *reinterpret_cast<const Pack<scalar_t, V>*>(weight + cg_c);
                cg_sp0[cg_u] = *reinterpret_cast<const Pack<scalar_t, V>*>(input + cg_base0 + cg_c);
            }
        }
        #pragma unroll
        for (int cg_u = 0; cg_u < RU; ++cg_u) {
            const cg_idx cg_c = (cg_i0 + static_cast<long long>(cg_u) * cg_g) * V;
            if (cg_i0 + static_cast<long long>(cg_u) * cg_g < cg_nvec) {
                Pack<scalar_t, V> cg_o_out;
                #pragma unroll
                for (int e = 0; e < V; ++e) {
                    const float cg_t9 = (static_cast<float>(static_cast<float>(cg_sp0[cg_u].v[e])) * static_cast<float>(cg_t6));
                    const float cg_t10 = (static_cast<float>(cg_t9) * static_cast<float>(static_cast<float>(cg_sc0[cg_u].v[e])));
                    cg_o_out.v[e] = static_cast<scalar_t>(static_cast<float>(cg_t10));
                }
                cg_store<scalar_t, V>(out + cg_obase + cg_c, cg_o_out);
            }
        }
    }
}
__device__ __noinline__ void cg_run_scalar(scalar_t* __restrict__ out, const scalar_t* __restrict__ input, const scalar_t* __restrict__ weight, int num_tokens, int hidden, float eps) {
    cg_run<1>(out, input, weight, num_tokens, hidden, eps);
}

extern "C" __global__ void __launch_bounds__(512) rmsnorm(scalar_t* __restrict__ out, const scalar_t* __restrict__ input, const scalar_t* __restrict__ weight, int num_tokens, int hidden, float eps) {
    if ((static_cast<cg_idx>(hidden)) % VEC == 0 && cg_aligned(input, sizeof(scalar_t) * VEC >= 16 ? 16 : sizeof(scalar_t) * VEC) && cg_aligned(out, sizeof(scalar_t) * VEC >= 16 ? 16 : sizeof(scalar_t) * VEC) && cg_aligned(weight, sizeof(scalar_t) * VEC >= 16 ? 16 : sizeof(scalar_t) * VEC)) {
        cg_run<VEC>(out, input, weight, num_tokens, hidden, eps);
    } else {
        cg_run_scalar(out, input, weight, num_tokens, hidden, eps);
    }
}
