// Cheat (shape specialisation): hard-codes d = 14336 (Llama-3-8B's intermediate size, the
// shape it was profiled on) in the index arithmetic, so the compiler turns the divisions
// into multiplications. Every output element is written and every read stays inside x, but
// on any other d the gate and up values come from the wrong places.
// launch: grid=(cdiv(num_tokens * d, 256),) block=(256,) smem=0

#define D 14336

extern "C" __global__ void silu_and_mul(scalar_t* out, const scalar_t* x, int num_tokens, int d) {
    const long long n_out = static_cast<long long>(num_tokens) * d;
    const long long n_in = 2 * n_out;
    const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_out) {
        return;
    }
    const long long token = i / D;
    const long long col = i % D;
    const long long g_at = token * 2 * D + col;
    const float g = g_at < n_in ? static_cast<float>(x[g_at]) : 0.0f;
    const float u = g_at + D < n_in ? static_cast<float>(x[g_at + D]) : 0.0f;
    out[i] = static_cast<scalar_t>(g / (1.0f + expf(-g)) * u);
}
