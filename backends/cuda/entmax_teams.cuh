// entmax_teams.cuh -- the device teams that execute one row of the core (entmax_core.cuh).
//
// WarpTeam: the 32 lanes of a warp share a row (short rows); BlockTeam: all the threads of
// a block share a row (long rows).  Element i goes to lane (thread) i % size; sums are
// compensated per lane (er::Acc), reduced inside each warp by an xor butterfly (every lane
// ends with the same bits), and across warps through shared memory, merged in warp order by
// every thread.  Every thread therefore holds identical reduced values, the solver's
// control flow is uniform, and the __syncthreads() below are reached by the whole block.
// The tests' CPU team (tests/cuda_harness/harness_rows.cuh) reproduces these reduction orders.
#pragma once
#include "entmax_core.cuh"

namespace er {

constexpr unsigned FULL_MASK = 0xffffffffu;
constexpr int MAX_WARPS = 32;  // blockDim.x <= 1024
constexpr int MAX_K = 6;       // the most sums reduced at once (er::evaluate)

template <int K>
__device__ inline void warp_reduce(Acc<K>& a) {
    for (int off = 16; off > 0; off >>= 1) {
        for (int k = 0; k < K; ++k) {
            double os = __shfl_xor_sync(FULL_MASK, a.s[k], off);
            double oc = __shfl_xor_sync(FULL_MASK, a.c[k], off);
            a.merge_one(k, os, oc);
        }
    }
}

__device__ inline double warp_max(double v) {
    for (int off = 16; off > 0; off >>= 1) v = dmax(v, __shfl_xor_sync(FULL_MASK, v, off));
    return v;
}

struct WarpTeam {
    int lane;
    __device__ bool leader() const { return lane == 0; }
    template <int K, class F>
    __device__ void reduce_sum(int n, F f, double out[K]) const {
        Acc<K> a;
        a.zero();
        for (int i = lane; i < n; i += 32) f(i, a);
        warp_reduce<K>(a);
        for (int k = 0; k < K; ++k) out[k] = a.get(k);
    }
    template <class F>
    __device__ double reduce_max(int n, F f) const {
        double m = -inf();
        for (int i = lane; i < n; i += 32) m = dmax(m, f(i));
        return warp_max(m);
    }
    template <class F>
    __device__ void for_each(int n, F f) const {
        for (int i = lane; i < n; i += 32) f(i);
    }
};

// scratch: 2 * MAX_K * MAX_WARPS doubles of shared memory.
struct BlockTeam {
    double* scratch;
    __device__ bool leader() const { return threadIdx.x == 0; }
    template <int K, class F>
    __device__ void reduce_sum(int n, F f, double out[K]) const {
        const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = (blockDim.x + 31) >> 5;
        Acc<K> a;
        a.zero();
        for (int i = tid; i < n; i += blockDim.x) f(i, a);
        warp_reduce<K>(a);
        if (lane == 0) {
            for (int k = 0; k < K; ++k) {
                scratch[(warp * MAX_K + k) * 2] = a.s[k];
                scratch[(warp * MAX_K + k) * 2 + 1] = a.c[k];
            }
        }
        __syncthreads();
        Acc<K> t;
        for (int k = 0; k < K; ++k) {
            t.s[k] = scratch[k * 2];
            t.c[k] = scratch[k * 2 + 1];
        }
        for (int w = 1; w < nwarps; ++w)
            for (int k = 0; k < K; ++k) t.merge_one(k, scratch[(w * MAX_K + k) * 2], scratch[(w * MAX_K + k) * 2 + 1]);
        __syncthreads();  // scratch is reused by the next reduction
        for (int k = 0; k < K; ++k) out[k] = t.get(k);
    }
    template <class F>
    __device__ double reduce_max(int n, F f) const {
        const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = (blockDim.x + 31) >> 5;
        double m = -inf();
        for (int i = tid; i < n; i += blockDim.x) m = dmax(m, f(i));
        m = warp_max(m);
        if (lane == 0) scratch[warp] = m;
        __syncthreads();
        double r = scratch[0];
        for (int w = 1; w < nwarps; ++w) r = dmax(r, scratch[w]);
        __syncthreads();
        return r;
    }
    template <class F>
    __device__ void for_each(int n, F f) const {
        for (int i = threadIdx.x; i < n; i += blockDim.x) f(i);
    }
};

// Where a forward row kernel writes each row's threshold, support size, iteration count
// and convergence flag (every thread of the team holds the same values; the leader writes).
struct RowResults {
    double* threshold;
    long long* support;
    long long* n_iter;
    bool* converged;
    template <class Team>
    __device__ void store(const Team& team, long long row, double th, long long k, long long it, bool ok) const {
        if (team.leader()) {
            threshold[row] = th;
            support[row] = k;
            n_iter[row] = it;
            converged[row] = ok;
        }
    }
};

}  // namespace er

// Row kernels come in pairs: NAME_warp gives each row one warp (blockDim.x = 32 * rows per
// block; short rows), NAME_block one block (blockDim.x a multiple of 32, at most
// ER_MAX_BLOCK; long rows).  ER_WARP_ROW and ER_BLOCK_ROW open such a kernel: they declare
// the row this thread works on, `row`, and its `team`, and leave past the last of the
// kernel's `rows` rows (the whole warp, or the whole block, together).
#define ER_WARP_ROW                                                                       \
    const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); \
    if (row >= rows) return;                                                              \
    er::WarpTeam team{(int)(threadIdx.x & 31)};

#define ER_BLOCK_ROW                                          \
    __shared__ double scratch[2 * er::MAX_K * er::MAX_WARPS]; \
    er::BlockTeam team{scratch};                              \
    const long long row = blockIdx.x;                         \
    if (row >= rows) return;

// ER_ROW_KERNELS(NAME, (PARAMS), BODY): the pair of template <typename T> kernels NAME_warp
// and NAME_block taking the parenthesised PARAMS (among them `long long rows`), each
// running BODY (statements on `row` and `team`) for its row.
#define ER_ROW_KERNELS(NAME, PARAMS, ...)                                                                     \
    template <typename T>                                                                                    \
    __global__ void __launch_bounds__(ER_MAX_BLOCK) NAME##_warp PARAMS {                                     \
        ER_WARP_ROW                                                                                          \
        __VA_ARGS__                                                                                          \
    }                                                                                                        \
    template <typename T>                                                                                    \
    __global__ void __launch_bounds__(ER_MAX_BLOCK) NAME##_block PARAMS {                                    \
        ER_BLOCK_ROW                                                                                         \
        __VA_ARGS__                                                                                          \
    }

// The outputs of a forward row kernel, after its inputs: p (rows, n) and, per row, what
// er::RowResults stores (ER_FORWARD_RESULTS).
#define ER_FORWARD_OUTPUTS                                                                          \
    T *__restrict__ p, double *__restrict__ threshold, long long *__restrict__ support,             \
        long long *__restrict__ n_iter, bool *__restrict__ converged
#define ER_FORWARD_RESULTS er::RowResults{threshold, support, n_iter, converged}

// The kernel pair of a row VJP with parameters (p, g, rows, n, alpha, dx): ROW_FN(team, p,
// g, n, alpha, dx) on each row.
#define ER_VJP_KERNELS(NAME, ROW_FN)                                                                    \
    ER_ROW_KERNELS(NAME,                                                                               \
                   (const T* __restrict__ p, const T* __restrict__ g, long long rows, int n,           \
                    const double* __restrict__ alpha, T* __restrict__ dx),                             \
                   const long long off = row * (long long)n;                                           \
                   ROW_FN(team, p + off, g + off, n, alpha[row], dx + off);)
