// minmax_quant_u8 baseline: per row lo = min x, hi = max x, scale = (hi - lo) / 255 (1 if
// hi == lo), q = clamp(rint((x - lo) / scale), 0, 255), fp32 math.
// The straightforward first kernel: one block per row, scalar loads, shared-memory tree
// reductions of the minimum and the maximum, then a second pass that quantises.
// launch: grid=(num_tokens,) block=(256,) smem=0

#define THREADS 256
#define POS_INF __int_as_float(0x7f800000)
#define NEG_INF __int_as_float(0xff800000)

extern "C" __global__ void minmax_quant_u8(unsigned char* q, float* scales, float* mins, const scalar_t* x,
                                           int num_tokens, int hidden) {
    __shared__ float lo_part[THREADS];
    __shared__ float hi_part[THREADS];
    const long long row = blockIdx.x;
    const scalar_t* src = x + row * hidden;
    unsigned char* dst = q + row * hidden;

    float lo = POS_INF, hi = NEG_INF;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        const float v = static_cast<float>(src[i]);
        lo = fminf(lo, v);
        hi = fmaxf(hi, v);
    }
    lo_part[threadIdx.x] = lo;
    hi_part[threadIdx.x] = hi;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) {
            lo_part[threadIdx.x] = fminf(lo_part[threadIdx.x], lo_part[threadIdx.x + stride]);
            hi_part[threadIdx.x] = fmaxf(hi_part[threadIdx.x], hi_part[threadIdx.x + stride]);
        }
        __syncthreads();
    }
    lo = lo_part[0];
    hi = hi_part[0];
    const float scale = hi > lo ? (hi - lo) / 255.0f : 1.0f;
    if (threadIdx.x == 0) {
        scales[row] = scale;
        mins[row] = lo;
    }
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        const float v = rintf((static_cast<float>(src[i]) - lo) / scale);
        dst[i] = static_cast<unsigned char>(fminf(fmaxf(v, 0.0f), 255.0f));
    }
}
