// reshape_and_cache baseline: for each token with slot >= 0, copy key[t, h, :] and
// value[t, h, :] to cache[slot / block_size, h, slot % block_size, :] (HND paged layout).
// The straightforward first kernel: one block per token, threads striding over
// (head, element), scalar loads and stores.
// launch: grid=(num_tokens,) block=(BLOCK,) smem=0
// tune: BLOCK=256,128,512,1024

#ifndef BLOCK
#define BLOCK 256
#endif
extern "C" __global__ void reshape_and_cache(const scalar_t* __restrict__ key, const scalar_t* __restrict__ value, scalar_t* __restrict__ key_cache, scalar_t* __restrict__ value_cache, const long long* __restrict__ slot_mapping, int num_tokens, int num_kv_heads, int head_size, int block_size, int num_blocks) {
    const long long token = blockIdx.x;
    const long long slot = slot_mapping[token];
    if (slot < 0) return;  // padding token
    const long long block = slot / block_size;
    const long long offset = slot % block_size;
    const int row = num_kv_heads * head_size;
    #pragma unroll 4
    for (int i = threadIdx.x; i < row; i += blockDim.x) {
        const int head = i / head_size;
        const int d = i % head_size;
        const long long dst = ((block * num_kv_heads + head) * block_size + offset) * head_size + d;
        key_cache[dst] = key[token * row + i];
        value_cache[dst] = value[token * row + i];
    }
}
