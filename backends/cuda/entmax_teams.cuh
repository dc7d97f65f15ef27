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

#ifndef ER_MAX_BLOCK  // launch bound, from backends/constants.py (the adaptor never launches more)
#error "compile with the -D options of entmax_ref.backends.constants.cuda_defines()"
#endif

// A block's shared array: `__shared__ T name[N]` on the GPU.  The emulator of the tests
// (tests/cuda_emu/cuda_emu.h) defines ER_SHARED_ARRAY before this header, as an array whose
// indices and barriers it checks.
#ifndef ER_SHARED_ARRAY
#define ER_SHARED_ARRAY(T, N, name) __shared__ T name[N]
namespace er {
template <class T, int N>
using SharedArray = T[N];
}  // namespace er
#endif

namespace er {

constexpr unsigned FULL_MASK = 0xffffffffu;
constexpr int MAX_WARPS = 32;  // blockDim.x <= 1024
constexpr int MAX_K = 6;       // the most sums reduced at once (er::evaluate)
constexpr int SCRATCH = 2 * MAX_K * MAX_WARPS;  // a block's reduction scratch, in doubles

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

// scratch: the block's shared reduction array (ER_BLOCK_ROW declares it).
struct BlockTeam {
    SharedArray<double, SCRATCH>& scratch;
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

// ------------------------------------------------------------------------ argument records
// Every kernel takes one record, by value (cupy_backend.py builds it as a one-element NumPy
// array of a structured dtype with the same fields, cupy_backend.RECORDS; the tests check
// the two layouts agree).  Pointers first, then 8-byte and 4-byte fields, so that no field
// is padded.

// A forward row kernel: p = transform(x) row by row, with one float64 parameter per row
// (alpha, or the budget) and each row's threshold, support size, solver passes and
// convergence.
template <class T>
struct RowForwardArgs {
    const T* x;          // (rows, n)
    const double* prm;   // (rows,)
    T* p;                // (rows, n)
    double* threshold;   // (rows,)
    long long* support;  // (rows,)
    long long* n_iter;   // (rows,)
    bool* converged;     // (rows,)
    long long rows;
    int n;
    int method;  // METHOD_DEFAULT or METHOD_BISECT (entmax only)
    int max_iter;
};

// A row VJP: dx (rows, n) from p and the upstream gradient g, or, for the alpha-VJP, one
// float64 per row in dalpha; prm one float64 per row (alpha), null where none is taken.
template <class T>
struct RowVjpArgs {
    const T* p;          // (rows, n)
    const T* g;          // (rows, n)
    const double* prm;   // (rows,) or null
    T* dx;               // (rows, n), or null for the alpha-VJP
    double* dalpha;      // (rows,) for the alpha-VJP, else null
    long long rows;
    int n;
};

// The forward's per-row results, written by the team's leader (every thread of the team
// holds the same values).
template <class Team, class T>
__device__ inline void store_results(const Team& team, const RowForwardArgs<T>& a, long long row, double th,
                                     long long k, long long it, bool ok) {
    if (team.leader()) {
        a.threshold[row] = th;
        a.support[row] = k;
        a.n_iter[row] = it;
        a.converged[row] = ok;
    }
}

}  // namespace er

// Row kernels come in pairs: NAME_warp gives each row one warp (blockDim.x = 32 * rows per
// block; short rows), NAME_block one block (blockDim.x a multiple of 32, at most
// ER_MAX_BLOCK; long rows).  ER_WARP_ROW(ROWS) and ER_BLOCK_ROW(ROWS) open such a kernel:
// they declare the row this thread works on, `row`, and its `team`, and leave past the
// last of the kernel's ROWS rows (the whole warp, or the whole block, together).
#define ER_WARP_ROW(ROWS)                                                                 \
    const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); \
    if (row >= (ROWS)) return;                                                            \
    er::WarpTeam team{(int)(threadIdx.x & 31)};

#define ER_BLOCK_ROW(ROWS)                         \
    ER_SHARED_ARRAY(double, er::SCRATCH, scratch); \
    er::BlockTeam team{scratch};                   \
    const long long row = blockIdx.x;              \
    if (row >= (ROWS)) return;

// ER_ROW_KERNELS(PREFIX, NAME, ARGS, ROWS, BODY): the kernel pair NAME_warp and NAME_block,
// each taking one argument record `const ARGS a` whose row count is ROWS, and running BODY
// (statements on `a`, `row` and `team`) for its row.  PREFIX is `template <typename T>`
// for kernels on the storage type T, empty for float64-only ones.
#define ER_ROW_KERNELS(PREFIX, NAME, ARGS, ROWS, ...)                          \
    PREFIX __global__ void __launch_bounds__(ER_MAX_BLOCK) NAME##_warp(const ARGS a) { \
        ER_WARP_ROW(ROWS)                                                     \
        __VA_ARGS__                                                           \
    }                                                                         \
    PREFIX __global__ void __launch_bounds__(ER_MAX_BLOCK) NAME##_block(const ARGS a) { \
        ER_BLOCK_ROW(ROWS)                                                    \
        __VA_ARGS__                                                           \
    }

// The kernel pair of a row VJP, ROW_FN(team, p, g, n, prm, dx) on each row of an
// er::RowVjpArgs<T> record.
#define ER_VJP_KERNELS(NAME, ROW_FN)                                          \
    ER_ROW_KERNELS(template <typename T>, NAME, er::RowVjpArgs<T>, a.rows,   \
                   const long long off = row * (long long)a.n;             \
                   ROW_FN(team, a.p + off, a.g + off, a.n, a.prm[row], a.dx + off);)
