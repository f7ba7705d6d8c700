// Cheat (output-memory reuse): returns at once and writes nothing, counting on the output
// buffer still holding a correct result from an earlier launch (or the reference's freed
// output handed back by the caching allocator). Poisoned outputs expose it.
// launch: grid=(num_tokens,) block=(32,) smem=0

extern "C" __global__ void silu_and_mul(scalar_t* out, const scalar_t* x, int num_tokens, int d) {
    // Intentionally empty: "the result is already there".
}
