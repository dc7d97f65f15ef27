// family_rows.cu -- alpha-normmax and budget-sparsemax kernels of the cupy backend.
//
// Inputs are C-contiguous (rows, n) arrays of T (float or double); alpha / budget are one
// float64 per row.  *_warp kernels give each row one warp (blockDim.x = 32 * rows per
// block), *_block kernels one block (blockDim.x a multiple of 32, at most ER_MAX_BLOCK),
// exactly as entmax_rows.cu.  The per-row math is family_core.cuh.
#include "entmax_teams.cuh"
#include "family_core.cuh"

namespace er {
template <>
struct SplitFinalSums<BlockTeam> {  // see family_core.cuh: avoids register spills
    static constexpr bool value = true;
};
}  // namespace er

#ifndef ER_MAX_BLOCK
#define ER_MAX_BLOCK 512
#endif

namespace {

template <class Team, class T>
__device__ void normmax_fwd(const Team& team, const T* __restrict__ x, long long row, int n, double alpha,
                            int max_iter, T* __restrict__ p, double* __restrict__ tau,
                            long long* __restrict__ support, long long* __restrict__ n_iter,
                            bool* __restrict__ converged) {
    const long long off = row * (long long)n;
    er::RowReader<T> xr{x + off};
    double m;
    er::FamilySolve s = er::normmax_solve(team, xr, n, alpha, max_iter, &m);
    long long k = er::normmax_write(team, xr, n, alpha, m, s, p + off);
    if (team.leader()) {
        tau[row] = s.tau;
        support[row] = k;
        n_iter[row] = s.n_iter;
        converged[row] = s.converged;
    }
}

template <class Team, class T>
__device__ void budget_fwd(const Team& team, const T* __restrict__ x, long long row, int n, double budget,
                           int max_iter, T* __restrict__ p, double* __restrict__ tau,
                           long long* __restrict__ support, long long* __restrict__ n_iter,
                           bool* __restrict__ converged) {
    const long long off = row * (long long)n;
    er::RowReader<T> xr{x + off};
    er::FamilySolve s = er::budget_solve(team, xr, n, budget, max_iter);
    long long k = er::budget_write(team, xr, n, s.tau, p + off);
    if (team.leader()) {
        tau[row] = s.tau;
        support[row] = k;
        n_iter[row] = s.n_iter;
        converged[row] = s.converged;
    }
}

}  // namespace

#define ER_WARP_ROW                                                                  \
    const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); \
    if (row >= rows) return;                                                         \
    er::WarpTeam team{(int)(threadIdx.x & 31)};

#define ER_BLOCK_ROW                                        \
    __shared__ double scratch[2 * er::MAX_K * er::MAX_WARPS]; \
    er::BlockTeam team{scratch};                            \
    const long long row = blockIdx.x;                       \
    if (row >= rows) return;

template <typename T>
__global__ void __launch_bounds__(ER_MAX_BLOCK) normmax_forward_warp(
    const T* __restrict__ x, long long rows, int n, const double* __restrict__ alpha, int max_iter,
    T* __restrict__ p, double* __restrict__ tau, long long* __restrict__ support, long long* __restrict__ n_iter,
    bool* __restrict__ converged) {
    ER_WARP_ROW
    normmax_fwd(team, x, row, n, alpha[row], max_iter, p, tau, support, n_iter, converged);
}

template <typename T>
__global__ void __launch_bounds__(ER_MAX_BLOCK) normmax_forward_block(
    const T* __restrict__ x, long long rows, int n, const double* __restrict__ alpha, int max_iter,
    T* __restrict__ p, double* __restrict__ tau, long long* __restrict__ support, long long* __restrict__ n_iter,
    bool* __restrict__ converged) {
    ER_BLOCK_ROW
    normmax_fwd(team, x, row, n, alpha[row], max_iter, p, tau, support, n_iter, converged);
}

template <typename T>
__global__ void __launch_bounds__(ER_MAX_BLOCK) normmax_vjp_warp(const T* __restrict__ p, const T* __restrict__ g,
                                                                  long long rows, int n,
                                                                  const double* __restrict__ alpha,
                                                                  T* __restrict__ dx) {
    ER_WARP_ROW
    const long long off = row * (long long)n;
    er::normmax_vjp_row(team, p + off, g + off, n, alpha[row], dx + off);
}

template <typename T>
__global__ void __launch_bounds__(ER_MAX_BLOCK) normmax_vjp_block(const T* __restrict__ p, const T* __restrict__ g,
                                                                   long long rows, int n,
                                                                   const double* __restrict__ alpha,
                                                                   T* __restrict__ dx) {
    ER_BLOCK_ROW
    const long long off = row * (long long)n;
    er::normmax_vjp_row(team, p + off, g + off, n, alpha[row], dx + off);
}

template <typename T>
__global__ void __launch_bounds__(ER_MAX_BLOCK) budget_forward_warp(
    const T* __restrict__ x, long long rows, int n, const double* __restrict__ budget, int max_iter,
    T* __restrict__ p, double* __restrict__ tau, long long* __restrict__ support, long long* __restrict__ n_iter,
    bool* __restrict__ converged) {
    ER_WARP_ROW
    budget_fwd(team, x, row, n, budget[row], max_iter, p, tau, support, n_iter, converged);
}

template <typename T>
__global__ void __launch_bounds__(ER_MAX_BLOCK) budget_forward_block(
    const T* __restrict__ x, long long rows, int n, const double* __restrict__ budget, int max_iter,
    T* __restrict__ p, double* __restrict__ tau, long long* __restrict__ support, long long* __restrict__ n_iter,
    bool* __restrict__ converged) {
    ER_BLOCK_ROW
    budget_fwd(team, x, row, n, budget[row], max_iter, p, tau, support, n_iter, converged);
}

template <typename T>
__global__ void __launch_bounds__(ER_MAX_BLOCK) budget_vjp_warp(const T* __restrict__ p, const T* __restrict__ g,
                                                                 long long rows, int n, T* __restrict__ dx) {
    ER_WARP_ROW
    const long long off = row * (long long)n;
    er::budget_vjp_row(team, p + off, g + off, n, dx + off);
}

template <typename T>
__global__ void __launch_bounds__(ER_MAX_BLOCK) budget_vjp_block(const T* __restrict__ p, const T* __restrict__ g,
                                                                  long long rows, int n, T* __restrict__ dx) {
    ER_BLOCK_ROW
    const long long off = row * (long long)n;
    er::budget_vjp_row(team, p + off, g + off, n, dx + off);
}
