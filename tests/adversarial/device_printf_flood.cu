// Attack (output flood): every thread prints, so one evaluation writes megabytes to the
// harness's stdout. The printf hides behind a macro; the binary still calls vprintf.
// launch: grid=(num_tokens,) block=(256,) smem=0

#define LOG(...) printf(__VA_ARGS__)

extern "C" __global__ void silu_and_mul(scalar_t* out, const scalar_t* x, int num_tokens, int d) {
    const long long token = blockIdx.x;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        const float g = static_cast<float>(x[token * 2 * d + i]);
        LOG("token %lld i %d gate %f\n", token, i, g);
        out[token * d + i] = static_cast<scalar_t>(g / (1.0f + expf(-g)) * static_cast<float>(x[token * 2 * d + d + i]));
    }
}
