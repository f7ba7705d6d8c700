// Fault (illegal address): scales the gate by a lookup table held in a __device__ pointer
// that host code was meant to set. No host code of a variant ever runs, so the pointer stays
// null and the first read faults.
// launch: grid=(num_tokens,) block=(256,) smem=0

__device__ const float* g_gate_scale;

extern "C" __global__ void silu_and_mul(scalar_t* out, const scalar_t* x, int num_tokens, int d) {
    const long long token = blockIdx.x;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        const float g = static_cast<float>(x[token * 2 * d + i]) * g_gate_scale[i];
        const float u = static_cast<float>(x[token * 2 * d + d + i]);
        out[token * d + i] = static_cast<scalar_t>(g / (1.0f + expf(-g)) * u);
    }
}
