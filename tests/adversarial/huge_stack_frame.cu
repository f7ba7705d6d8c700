// Resource error (stack): a 520 KB local array per thread; at launch the driver would reserve
// that much local memory for every resident thread (tens of GB on an H200).
// launch: grid=(num_tokens,) block=(256,) smem=0

extern "C" __global__ void silu_and_mul(scalar_t* out, const scalar_t* x, int num_tokens, int d) {
    volatile float scratch[130000];
    const long long token = blockIdx.x;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        const float g = static_cast<float>(x[token * 2 * d + i]);
        scratch[(i * 7) % 130000] = g;
        out[token * d + i] = static_cast<scalar_t>(scratch[(i * 7) % 130000] / (1.0f + expf(-g)) *
                                                   static_cast<float>(x[token * 2 * d + d + i]));
    }
}
