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
                            int max_iter, T* __restrict__ p, const er::RowResults& out) {
    const long long off = row * (long long)n;
    er::RowReader<T> xr{x + off};
    double m;
    er::FamilySolve s = er::normmax_solve(team, xr, n, alpha, max_iter, &m);
    out.store(team, row, s.tau, er::normmax_write(team, xr, n, alpha, m, s, p + off), s.n_iter, s.converged);
}

template <class Team, class T>
__device__ void budget_fwd(const Team& team, const T* __restrict__ x, long long row, int n, double budget,
                           int max_iter, T* __restrict__ p, const er::RowResults& out) {
    const long long off = row * (long long)n;
    er::RowReader<T> xr{x + off};
    er::FamilySolve s = er::budget_solve(team, xr, n, budget, max_iter);
    out.store(team, row, s.tau, er::budget_write(team, xr, n, s.tau, p + off), s.n_iter, s.converged);
}

}  // namespace

// The forward and VJP kernels, each as a warp-per-row and a block-per-row kernel
// (entmax_teams.cuh).
ER_ROW_KERNELS(normmax_forward,
               (const T* __restrict__ x, long long rows, int n, const double* __restrict__ alpha, int max_iter,
                ER_FORWARD_OUTPUTS),
               normmax_fwd(team, x, row, n, alpha[row], max_iter, p, ER_FORWARD_RESULTS);)

ER_VJP_KERNELS(normmax_vjp, er::normmax_vjp_row)

ER_ROW_KERNELS(budget_forward,
               (const T* __restrict__ x, long long rows, int n, const double* __restrict__ budget, int max_iter,
                ER_FORWARD_OUTPUTS),
               budget_fwd(team, x, row, n, budget[row], max_iter, p, ER_FORWARD_RESULTS);)

ER_ROW_KERNELS(budget_vjp,
               (const T* __restrict__ p, const T* __restrict__ g, long long rows, int n, T* __restrict__ dx),
               const long long off = row * (long long)n;
               er::budget_vjp_row(team, p + off, g + off, n, dx + off);)
