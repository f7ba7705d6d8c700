// Attack (probe): __has_include as a file-existence oracle; the kernel compiles one way or
// the other depending on whether a file of the machine exists.
// launch: grid=(num_tokens,) block=(256,) smem=0

#if __has_include("/etc/passwd")
#define PROBE 1
#else
#define PROBE 0
#endif

extern "C" __global__ void silu_and_mul(scalar_t* out, const scalar_t* x, int num_tokens, int d) {
    const long long token = blockIdx.x;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        const float g = static_cast<float>(x[token * 2 * d + i]);
        out[token * d + i] = static_cast<scalar_t>(g / (1.0f + expf(-g)) * static_cast<float>(x[token * 2 * d + d + i]));
    }
}
