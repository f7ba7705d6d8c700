"""CUDA text the generated kernels share: helpers pasted in front of a schedule's kernel.

``PRELUDE`` (vectors, NaN-keeping max and min, warp and row reductions) goes in front of
every schedule; the others only where a schedule uses them: ``CLUSTER_PRELUDE`` (sm_90
clusters), ``ONLINE_PRELUDE`` (one-pass max and sum of exp(x - max)) and
``CLUSTER_ONLINE_PRELUDE`` (the latter over a cluster).
"""

from __future__ import annotations

POS_INF = "__int_as_float(0x7f800000)"
NEG_INF = "__int_as_float(0xff800000)"

PRELUDE = """\
constexpr int VEC = 16 / sizeof(scalar_t);

// The type of element indices and sizes. A schedule that proves at launch that every index
// fits 32 bits runs a copy of its code with int instead (a template parameter of that name
// hides this one): 64-bit index arithmetic took ~10% of a short elementwise thread.
typedef long long cg_idx;

// V elements of T, aligned for one (or, past 16 bytes, several) wide loads.
template <typename T, int V>
struct alignas(sizeof(T) * V >= 16 ? 16 : sizeof(T) * V) Pack {
    T v[V];
};

// Stores a pack with one vector store. Assigned as a struct, a pack of 2-byte elements came out
// of the compiler as 2- and 4-byte stores (read in the PTX of the elementwise and transpose
// schedules), even 16-byte aligned; the __stwb intrinsics are single vector stores with the
// default (write-back) cache policy, fed with 32-bit words built from the elements' bits.
template <typename T, int V>
__device__ __forceinline__ void cg_store(T* p, const Pack<T, V>& x) {
    constexpr int S = static_cast<int>(sizeof(T)), B = S * V;
    if constexpr (S <= 4 && 4 % S == 0 && B % 4 == 0 && (B <= 8 || B % 16 == 0)) {
        constexpr int PER = 4 / S;  // elements per word
        unsigned int w[B / 4];
#pragma unroll
        for (int k = 0; k < B / 4; ++k) {
            w[k] = 0u;
#pragma unroll
            for (int j = 0; j < PER; ++j) {
                unsigned int bits = 0u;
                memcpy(&bits, &x.v[k * PER + j], S);
                w[k] |= bits << (8 * S * j);
            }
        }
        if constexpr (B % 16 == 0) {
#pragma unroll
            for (int k = 0; k < B / 16; ++k) {
                __stwb(reinterpret_cast<uint4*>(p) + k, make_uint4(w[4 * k], w[4 * k + 1], w[4 * k + 2], w[4 * k + 3]));
            }
        } else if constexpr (B == 8) {
            __stwb(reinterpret_cast<uint2*>(p), make_uint2(w[0], w[1]));
        } else {
            __stwb(reinterpret_cast<unsigned int*>(p), w[0]);
        }
    } else {
        *reinterpret_cast<Pack<T, V>*>(p) = x;
    }
}

// Maximum and minimum that keep NaN, as torch does (fmaxf would drop it).
__device__ __forceinline__ float cg_max(float a, float b) { return (a != a || b != b) ? a + b : fmaxf(a, b); }
__device__ __forceinline__ float cg_min(float a, float b) { return (a != a || b != b) ? a + b : fminf(a, b); }
// torch.remainder: the remainder with the divisor's sign (Python's %), from fmodf.
__device__ __forceinline__ float cg_remainder(float a, float b) {
    const float m = fmodf(a, b);
    return (m != 0.0f && ((b < 0.0f) != (m < 0.0f))) ? m + b : m;
}
__device__ __forceinline__ long long cg_remainder_int(long long a, long long b) {
    const long long m = a % b;
    return (m != 0 && ((b < 0) != (m < 0))) ? m + b : m;
}
// A cat's piece column, clamped into the piece's [0, n).
template <typename I>
__device__ __forceinline__ I cg_clamp_col(I c, I n) { return c < 0 ? I(0) : (c >= n ? n - 1 : c); }
__device__ __forceinline__ float cg_relu(float a) { return a != a ? a : fmaxf(a, 0.0f); }
// torch.sign: NaN stays NaN, zero stays zero.
__device__ __forceinline__ float cg_sign(float a) { return a > 0.0f ? 1.0f : (a < 0.0f ? -1.0f : a); }
__device__ __forceinline__ bool cg_isnan(float a) { return a != a; }
__device__ __forceinline__ bool cg_isinf(float a) { return fabsf(a) == __int_as_float(0x7f800000); }

__device__ __forceinline__ bool cg_aligned(const void* p, unsigned bytes) {
    return (reinterpret_cast<unsigned long long>(p) & (bytes - 1)) == 0;
}

template <int OP>
__device__ __forceinline__ float cg_combine(float a, float b) {
    return OP == 0 ? a + b : (OP == 1 ? cg_max(a, b) : cg_min(a, b));
}

template <int OP>
__device__ __forceinline__ float cg_warp_reduce(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = cg_combine<OP>(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// As cg_warp_reduce over the blockDim.x lanes of one row: a row narrower than a warp (4, 8 or 16
// threads) shares the warp with the next rows, and the butterfly stays inside its lanes.
template <int OP>
__device__ __forceinline__ float cg_row_warp_reduce(float v) {
    if (blockDim.x >= 32) return cg_warp_reduce<OP>(v);
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) {
        if (o < static_cast<int>(blockDim.x)) v = cg_combine<OP>(v, __shfl_xor_sync(0xffffffffu, v, o));
    }
    return v;
}

// Reduces over the blockDim.x threads of one row (threadIdx.y): every thread gets the result.
// Called by every thread of the block (rows past the end too), so the barriers are uniform.
template <int OP>
__device__ __forceinline__ float cg_group_reduce(float v, float identity) {
    __shared__ float part[32][33];
    v = cg_row_warp_reduce<OP>(v);
    if (blockDim.x > 32) {
        const int lane = threadIdx.x & 31;
        __syncthreads();  // the previous reduction's reads of part are done
        if (lane == 0) part[threadIdx.y][threadIdx.x >> 5] = v;
        __syncthreads();
        v = lane < static_cast<int>(blockDim.x >> 5) ? part[threadIdx.y][lane] : identity;
        v = cg_warp_reduce<OP>(v);
    }
    return v;
}
"""

# Hopper thread-block clusters (sm_90): the CL blocks of one row synchronise with the cluster
# barrier and read each other's shared memory (distributed shared memory), so a row is split
# over CL SMs without a second kernel or a workspace. Only worth it when there are too few rows
# to fill the GPU: with SPLIT rows or more, each block of a cluster takes a row of its own.
CLUSTER_PRELUDE = """\
__device__ __forceinline__ void cg_cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\\n\\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

__device__ __forceinline__ float cg_cluster_read(const float* p, unsigned rank) {
    const unsigned local = static_cast<unsigned>(__cvta_generic_to_shared(p));
    unsigned remote;
    float v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
    return v;
}

// The block's reduction, then the CL blocks' partials combined in rank order (so every block
// of the cluster gets the same bits). The first barrier keeps a block from overwriting its
// partial while another still reads the previous one.
template <int OP>
__device__ __forceinline__ float cg_cluster_reduce(float v, float identity, bool split) {
    __shared__ float cg_partial;
    v = cg_group_reduce<OP>(v, identity);
    if (!split) return v;  // the same for every block of the cluster: the barriers stay uniform
    cg_cluster_sync();
    if (threadIdx.x == 0) cg_partial = v;
    cg_cluster_sync();
    float acc = identity;
#pragma unroll
    for (int r = 0; r < CL; ++r) acc = cg_combine<OP>(acc, cg_cluster_read(&cg_partial, r));
    return acc;
}
"""

# Online softmax statistics: a max m and a sum s of exp(x - m) in one pass over the row instead
# of two (Milakov and Gimelshein, 2018). The pair (m, s) rescales s whenever m grows.
# Elements of -inf and empty pairs add nothing; NaN makes both NaN (as cg_max keeps NaN); the
# caller's fix-up (cg_online_end) gives NaN where the two-pass formula does: a max of +-inf.
ONLINE_PRELUDE = """\
// V elements at once (V = 1 on the scalar path): one rescale per vector at most and no branch
// per element (an update per element measured slower than two passes). A NaN makes both NaN,
// elements of -inf add nothing.
template <int V>
__device__ __forceinline__ void cg_online_vec(float& m, float& s, const float (&x)[V]) {
    float top = x[0];
#pragma unroll
    for (int e = 1; e < V; ++e) top = (top != top || x[e] != x[e]) ? top + x[e] : fmaxf(top, x[e]);
    if (top != top || m != m) { m = m + top; s = s + top; return; }
    if (top == __int_as_float(0xff800000)) return;
    if (top > m) { s = s == 0.0f ? 0.0f : s * expf(m - top); m = top; }
#pragma unroll
    for (int e = 0; e < V; ++e) s += expf(x[e] - m);
}

// Commutative (the same bits whichever pair comes first), so butterfly shuffles agree.
__device__ __forceinline__ void cg_online_combine(float& m, float& s, float m2, float s2) {
    if (m != m || m2 != m2) { m = m + m2; s = s + s2; return; }
    const float top = fmaxf(m, m2);
    const float a = s == 0.0f ? 0.0f : s * expf(m - top);
    const float b = s2 == 0.0f ? 0.0f : s2 * expf(m2 - top);
    m = top;
    s = a + b;
}

__device__ __forceinline__ void cg_online_warp(float& m, float& s) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        if (o >= static_cast<int>(blockDim.x)) continue;  // inside the row's lanes, as cg_row_warp_reduce
        const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
        const float s2 = __shfl_xor_sync(0xffffffffu, s, o);
        cg_online_combine(m, s, m2, s2);
    }
}

// Over the blockDim.x threads of one row, as cg_group_reduce: every thread gets the pair.
__device__ __forceinline__ void cg_online_group(float& m, float& s) {
    __shared__ float pm[32][33], ps[32][33];
    cg_online_warp(m, s);
    if (blockDim.x > 32) {
        const int lane = threadIdx.x & 31;
        __syncthreads();
        if (lane == 0) { pm[threadIdx.y][threadIdx.x >> 5] = m; ps[threadIdx.y][threadIdx.x >> 5] = s; }
        __syncthreads();
        const bool has = lane < static_cast<int>(blockDim.x >> 5);
        m = has ? pm[threadIdx.y][lane] : __int_as_float(0xff800000);
        s = has ? ps[threadIdx.y][lane] : 0.0f;
        cg_online_warp(m, s);
    }
}

// The two-pass formula's sum for a max of +-inf (a row of -inf only, or one holding +inf): NaN.
__device__ __forceinline__ float cg_online_end(float m, float s, long long cols) {
    return (cols > 0 && (m == __int_as_float(0xff800000) || m == __int_as_float(0x7f800000)))
        ? __int_as_float(0x7fffffff) : s;
}
"""

CLUSTER_ONLINE_PRELUDE = """\
// The pair over the CL blocks of a split row, folded in rank order as cg_cluster_reduce does.
__device__ __forceinline__ void cg_cluster_online(float& m, float& s, bool split) {
    __shared__ float cg_pm, cg_ps;
    cg_online_group(m, s);
    if (!split) return;
    cg_cluster_sync();
    if (threadIdx.x == 0) { cg_pm = m; cg_ps = s; }
    cg_cluster_sync();
    m = __int_as_float(0xff800000);
    s = 0.0f;
#pragma unroll
    for (int r = 0; r < CL; ++r) cg_online_combine(m, s, cg_cluster_read(&cg_pm, r), cg_cluster_read(&cg_ps, r));
}
"""

# A top-k along the row, one pick at a time: each pass keeps the best element ranked after the
# previous pick, then the row's threads agree on the best (value, column) pair. The order is
# torch.topk's: NaN first (largest) or last (smallest), then by value, equal values by column
# (torch leaves their order open; the lower column first is the stable sort's order).
TOPK_PRELUDE = """\
template <bool LARGEST>
__device__ __forceinline__ bool cg_before(float a, long long ca, float b, long long cb) {
    const bool an = a != a, bn = b != b;
    if (an || bn) return an && bn ? ca < cb : (LARGEST ? an : bn);
    if (a != b) return LARGEST ? a > b : a < b;
    return ca < cb;
}

// The element (v, c) into this thread's best (bv, bc) of the elements ranked after the
// previous pick (lv, lc), every element when first. A column of -1 is no element.
template <bool LARGEST>
__device__ __forceinline__ void cg_best_update(float& bv, long long& bc, float lv, long long lc, bool first,
                                               float v, long long c) {
    if ((first || cg_before<LARGEST>(lv, lc, v, c)) && (bc < 0 || cg_before<LARGEST>(v, c, bv, bc))) {
        bv = v;
        bc = c;
    }
}

template <bool LARGEST>
__device__ __forceinline__ void cg_best_warp(float& v, long long& c) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        if (o >= static_cast<int>(blockDim.x)) continue;  // inside the row's lanes
        const float v2 = __shfl_xor_sync(0xffffffffu, v, o);
        const long long c2 = __shfl_xor_sync(0xffffffffu, c, o);
        if (c2 >= 0 && (c < 0 || cg_before<LARGEST>(v2, c2, v, c))) { v = v2; c = c2; }
    }
}

// The best pair over the blockDim.x threads of one row, as cg_group_reduce: every thread gets
// it. The order is total, so every thread's butterfly ends on the same pair.
template <bool LARGEST>
__device__ __forceinline__ void cg_group_best(float& v, long long& c) {
    __shared__ float bv[32][33];
    __shared__ long long bc[32][33];
    cg_best_warp<LARGEST>(v, c);
    if (blockDim.x > 32) {
        const int lane = threadIdx.x & 31;
        __syncthreads();
        if (lane == 0) { bv[threadIdx.y][threadIdx.x >> 5] = v; bc[threadIdx.y][threadIdx.x >> 5] = c; }
        __syncthreads();
        const bool has = lane < static_cast<int>(blockDim.x >> 5);
        v = has ? bv[threadIdx.y][lane] : 0.0f;
        c = has ? bc[threadIdx.y][lane] : -1LL;
        cg_best_warp<LARGEST>(v, c);
    }
}

// Radix select of a row's top k (tune SELECT): rather than a pass per pick, the k-th ranked
// element's key is found 8 bits at a time, each digit by a histogram of the row's keys that
// match the digits found so far (up to 4 passes); the elements tied at that key are cut in
// column order the same way (up to 4 more, only when a row has more ties than picks). A digit
// whose elements are all picks ends the search early: the picks are then every element whose
// key, down to that digit, is at or above the one found. A last pass gathers the k picks into
// shared memory, where each pick's rank among them puts it in order.
// Keys: a larger key is ranked first (cg_before's order): -0 and +0 equal, NaN first when
// LARGEST and last otherwise; a tie's column key ~column puts lower columns first.
template <bool LARGEST>
__device__ __forceinline__ unsigned cg_rank_key(float v) {
    if (v != v) return LARGEST ? 0xffffffffu : 0u;
    const unsigned b = __float_as_uint(v == 0.0f ? 0.0f : v);
    const unsigned k = (b & 0x80000000u) ? ~b : (b | 0x80000000u);  // ascending with v
    return LARGEST ? k : ~k;
}

// A row's search: the key's digits found (prefix, down to bit ks), the column key's (cprefix,
// down to cs), the rank sought within the elements matching them, and whether the key's or
// the column's search has ended. Its phases: 0-3 the key's digits, 4-7 the column key's among
// the ties, 8 the gathering pass.
struct CgRadix {
    unsigned prefix, cprefix, rank, ks, cs, key_final, col_final;
};

// Per row of the block (at most 8 rows and 512 threads, as the top-k launches give).
struct CgRadixShared {
    unsigned hist[8][256];
    unsigned lane_sum[8][32];
    CgRadix state[8];
    unsigned count[8];  // picks gathered
    float v[512];       // the picks, blockDim.x per row
    int c[512];
    int busy;           // some row of the block needs the next phase
};

__device__ __forceinline__ CgRadixShared& cg_radix_shared() {
    __shared__ CgRadixShared s;
    return s;
}

// Called by every thread of the block before the first pass.
__device__ __forceinline__ CgRadix cg_radix_begin(long long k) {
    CgRadixShared& s = cg_radix_shared();
    if (blockDim.y > 8 || blockDim.x * blockDim.y > 512 || blockDim.x < 32) __trap();
    for (int i = threadIdx.x; i < 256; i += blockDim.x) s.hist[threadIdx.y][i] = 0u;
    const CgRadix r{0u, 0u, static_cast<unsigned>(k), 0u, 0u, 0u, 0u};
    if (threadIdx.x == 0) {
        s.state[threadIdx.y] = r;
        s.count[threadIdx.y] = 0u;
    }
    __syncthreads();
    return r;
}

// Counts key's digit (0: the highest 8 bits) if its higher digits are those found (prefix's).
__device__ __forceinline__ void cg_radix_count(unsigned key, unsigned prefix, int digit) {
    const int shift = 24 - 8 * digit;
    if (digit == 0 || (key >> (shift + 8)) == (prefix >> (shift + 8)))
        atomicAdd(&cg_radix_shared().hist[threadIdx.y][(key >> shift) & 255u], 1u);
}

// One element (value v at column c) of this thread's row in the given phase.
template <bool LARGEST>
__device__ __forceinline__ void cg_radix_element(const CgRadix& r, int phase, long long k, float v, long long c) {
    CgRadixShared& s = cg_radix_shared();
    const unsigned key = cg_rank_key<LARGEST>(v);
    const unsigned ck = ~static_cast<unsigned>(c);
    if (phase < 4) {
        if (!r.key_final) cg_radix_count(key, r.prefix, phase);
    } else if (phase < 8) {
        if (!r.key_final && !r.col_final && key == r.prefix) cg_radix_count(ck, r.cprefix, phase - 4);
    } else {
        const unsigned a = key >> r.ks, b = r.prefix >> r.ks;
        if (a > b || (a == b && (r.key_final || (ck >> r.cs) >= (r.cprefix >> r.cs)))) {
            const unsigned slot = atomicAdd(&s.count[threadIdx.y], 1u);
            if (slot < k) {  // exactly k qualify; the test keeps a wrong count inside the row's slots
                s.v[threadIdx.y * blockDim.x + slot] = v;
                s.c[threadIdx.y * blockDim.x + slot] = static_cast<int>(c);
            }
        }
    }
}

// After a counting pass (every thread of the block): the digit holding the rank sought, from
// the histogram's top; the rank within it; whether the search ends there (the digit's elements
// are all picks, or the row has none: a row past the end); the histogram cleared.
__device__ __forceinline__ void cg_radix_choose(CgRadix& r, int phase) {
    CgRadixShared& s = cg_radix_shared();
    const int y = threadIdx.y, lane = threadIdx.x;
    const bool columns = phase >= 4;
    const bool open = !r.key_final && !(columns && r.col_final);
    __syncthreads();  // the pass's counts are in
    if (lane < 32) {
        unsigned t = 0u;
        for (int i = 0; i < 8; ++i) t += s.hist[y][255 - 8 * lane - i];
        s.lane_sum[y][lane] = t;
    }
    if (lane == 0 && y == 0) s.busy = 0;  // every thread has read it (at the loop's top) before this barrier's first
    __syncthreads();
    if (lane < 32 && open) {
        unsigned before = 0u;
        for (int l = 0; l < lane; ++l) before += s.lane_sum[y][l];
        if (lane == 31 && before + s.lane_sum[y][lane] < r.rank) s.state[y].key_final = 1u;  // fewer elements than picks
        if (before < r.rank && r.rank <= before + s.lane_sum[y][lane]) {
            for (int i = 0; i < 8; ++i) {
                const unsigned d = 255u - 8u * lane - i, n = s.hist[y][d];
                if (r.rank <= before + n) {
                    const unsigned shift = 24u - 8u * (phase & 3), rank = r.rank - before;
                    CgRadix& st = s.state[y];
                    st.rank = rank;
                    if (columns) {
                        st.cprefix = r.cprefix | (d << shift);
                        st.cs = shift;
                        st.col_final = n == rank ? 1u : 0u;
                    } else {
                        st.prefix = r.prefix | (d << shift);
                        st.ks = shift;
                        st.key_final = n == rank ? 1u : 0u;
                    }
                    if (n != rank) atomicOr(&s.busy, 1);
                    break;
                }
                before += n;
            }
        }
    }
    __syncthreads();
    r = s.state[y];
    for (int i = lane; i < 256; i += blockDim.x) s.hist[y][i] = 0u;
    __syncthreads();
}

// After the gathering pass: the k picks in order, thread j of the row taking pick j.
template <bool LARGEST>
__device__ __forceinline__ void cg_radix_order(long long k, float& pv, long long& pc) {
    CgRadixShared& s = cg_radix_shared();
    float* sv = s.v + threadIdx.y * blockDim.x;
    int* sc = s.c + threadIdx.y * blockDim.x;
    const int lane = threadIdx.x;
    __syncthreads();  // the gathered picks are in
    float v = 0.0f;
    int c = 0, rank = 0;
    if (lane < k) {
        v = sv[lane];
        c = sc[lane];
        for (int j = 0; j < k; ++j) rank += cg_before<LARGEST>(sv[j], sc[j], v, c) ? 1 : 0;
    }
    __syncthreads();
    if (lane < k) {
        sv[rank] = v;
        sc[rank] = c;
    }
    __syncthreads();
    if (lane < k) {
        pv = sv[lane];
        pc = sc[lane];
    }
}

// Thread j's value, given to every thread of its row (a value at one pick).
template <typename T>
__device__ __forceinline__ T cg_group_at(T v, long long j) {
    __shared__ T slot[32];
    __syncthreads();  // the previous call's reads are done
    if (threadIdx.x == j) slot[threadIdx.y] = v;
    __syncthreads();
    return slot[threadIdx.y];
}
"""
