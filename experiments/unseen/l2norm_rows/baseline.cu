// l2norm_rows baseline: out = x / max(sqrt(sum x^2), eps) per row, fp32 math.
// The straightforward first kernel: one block per row, scalar loads, a shared-memory tree
// reduction of the sum of squares, then a second pass over the row that writes.
// launch: grid=(num_tokens,) block=(256,) smem=0

#define THREADS 256

extern "C" __global__ void l2norm_rows(scalar_t* out, const scalar_t* x, int num_tokens, int hidden, float eps) {
    __shared__ float partial[THREADS];
    const long long row = blockIdx.x;
    const scalar_t* src = x + row * hidden;
    scalar_t* dst = out + row * hidden;

    float sum = 0.0f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        const float v = static_cast<float>(src[i]);
        sum += v * v;
    }
    partial[threadIdx.x] = sum;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
        __syncthreads();
    }
    const float norm = fmaxf(sqrtf(partial[0]), eps);
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        dst[i] = static_cast<scalar_t>(static_cast<float>(src[i]) / norm);
    }
}
