// kv_cache_write baseline: cache[slots[t], :] = k[t, :] (a negative slot counts from the end).
// The straightforward first kernel: one block per token, threads striding over the row with
// scalar loads and stores.
// launch: grid=(num_tokens,) block=(256,) smem=0

extern "C" __global__ void kv_cache_write(scalar_t* cache, const scalar_t* k, const long long* slots,
                                          int num_tokens, int hidden, int num_slots) {
    const long long token = blockIdx.x;
    long long slot = slots[token];
    if (slot < 0) slot += num_slots;
    scalar_t* dst = cache + slot * hidden;
    const scalar_t* src = k + token * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = src[i];
}
