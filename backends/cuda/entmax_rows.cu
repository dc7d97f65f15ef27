// entmax_rows.cu -- row-wise alpha-entmax kernels of the cupy backend.
//
// Inputs are C-contiguous (rows, n) arrays of T (float or double); alpha is one float64
// per row.  *_warp kernels give each row one warp (blockDim.x = 32 * rows per block),
// *_block kernels one block (blockDim.x a multiple of 32, at most 1024).  The per-row
// work is the __host__ __device__ core in entmax_core.cuh; see that file for the math.
#include "entmax_teams.cuh"

#ifndef ER_MAX_BLOCK  // launch bound, from backends/constants.py (the adaptor never launches more)
#error "compile with the -D options of entmax_ref.backends.constants.cuda_defines()"
#endif

namespace {

template <class Team, class T>
__device__ void forward_row(const Team& team, const T* __restrict__ x, long long row, int n,
                            const double* __restrict__ alpha, int method, int max_iter, T* __restrict__ p,
                            double* __restrict__ theta, long long* __restrict__ support,
                            long long* __restrict__ n_iter, bool* __restrict__ converged) {
    const long long off = row * (long long)n;
    er::RowReader<T> xr{x + off};
    er::Solve s = er::solve_row(team, xr, n, alpha[row], method, max_iter);
    long long k = er::write_probs(team, xr, n, alpha[row], s, p + off);
    if (team.leader()) {  // every thread holds the same values; one writes them
        theta[row] = s.theta;
        support[row] = k;
        n_iter[row] = s.n_iter;
        converged[row] = s.converged;
    }
}

}  // namespace

template <typename T>
__global__ void __launch_bounds__(ER_MAX_BLOCK) entmax_forward_warp(const T* __restrict__ x, long long rows, int n, const double* __restrict__ alpha,
                                    int method, int max_iter, T* __restrict__ p, double* __restrict__ theta,
                                    long long* __restrict__ support, long long* __restrict__ n_iter,
                                    bool* __restrict__ converged) {
    const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;  // the whole warp leaves together
    er::WarpTeam team{(int)(threadIdx.x & 31)};
    forward_row(team, x, row, n, alpha, method, max_iter, p, theta, support, n_iter, converged);
}

template <typename T>
__global__ void __launch_bounds__(ER_MAX_BLOCK) entmax_forward_block(const T* __restrict__ x, long long rows, int n, const double* __restrict__ alpha,
                                     int method, int max_iter, T* __restrict__ p, double* __restrict__ theta,
                                     long long* __restrict__ support, long long* __restrict__ n_iter,
                                     bool* __restrict__ converged) {
    __shared__ double scratch[2 * er::MAX_K * er::MAX_WARPS];
    er::BlockTeam team{scratch};
    const long long row = blockIdx.x;
    if (row >= rows) return;
    forward_row(team, x, row, n, alpha, method, max_iter, p, theta, support, n_iter, converged);
}

template <typename T>
__global__ void __launch_bounds__(ER_MAX_BLOCK) entmax_vjp_warp(const T* __restrict__ p, const T* __restrict__ g, long long rows, int n,
                                const double* __restrict__ alpha, T* __restrict__ dx) {
    const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;
    const long long off = row * (long long)n;
    er::WarpTeam team{(int)(threadIdx.x & 31)};
    er::vjp_row(team, p + off, g + off, n, alpha[row], dx + off);
}

template <typename T>
__global__ void __launch_bounds__(ER_MAX_BLOCK) entmax_vjp_block(const T* __restrict__ p, const T* __restrict__ g, long long rows, int n,
                                 const double* __restrict__ alpha, T* __restrict__ dx) {
    __shared__ double scratch[2 * er::MAX_K * er::MAX_WARPS];
    er::BlockTeam team{scratch};
    const long long row = blockIdx.x;
    if (row >= rows) return;
    const long long off = row * (long long)n;
    er::vjp_row(team, p + off, g + off, n, alpha[row], dx + off);
}

template <typename T>
__global__ void __launch_bounds__(ER_MAX_BLOCK) entmax_alpha_vjp_warp(const T* __restrict__ p, const T* __restrict__ g, long long rows, int n,
                                      const double* __restrict__ alpha, double* __restrict__ out) {
    const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;
    const long long off = row * (long long)n;
    er::WarpTeam team{(int)(threadIdx.x & 31)};
    double r = er::alpha_vjp_row(team, p + off, g + off, n, alpha[row]);
    if (team.leader()) out[row] = r;
}

template <typename T>
__global__ void __launch_bounds__(ER_MAX_BLOCK) entmax_alpha_vjp_block(const T* __restrict__ p, const T* __restrict__ g, long long rows, int n,
                                       const double* __restrict__ alpha, double* __restrict__ out) {
    __shared__ double scratch[2 * er::MAX_K * er::MAX_WARPS];
    er::BlockTeam team{scratch};
    const long long row = blockIdx.x;
    if (row >= rows) return;
    const long long off = row * (long long)n;
    double r = er::alpha_vjp_row(team, p + off, g + off, n, alpha[row]);
    if (team.leader()) out[row] = r;
}
