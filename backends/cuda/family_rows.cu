// family_rows.cu -- alpha-normmax and budget-sparsemax kernels of the cupy backend.
//
// Inputs are C-contiguous (rows, n) arrays of T (float or double); alpha / budget are one
// float64 per row.  *_warp kernels give each row one warp (blockDim.x = 32 * rows per
// block), *_block kernels one block (blockDim.x a multiple of 32, at most ER_MAX_BLOCK),
// exactly as entmax_rows.cu.  The per-row math is family_core.cuh.
#include "entmax_teams.cuh"
#include "family_core.cuh"

namespace {

template <class Team, class T>
__device__ void normmax_fwd(const Team& team, const er::RowForwardArgs<T>& a, long long row) {
    const long long off = row * (long long)a.n;
    er::RowReader<T> xr{a.x + off};
    double m;
    const double alpha = a.prm[row];
    er::FamilySolve s = er::normmax_solve(team, xr, a.n, alpha, a.max_iter, &m);
    er::store_results(team, a, row, s.tau, er::normmax_write(team, xr, a.n, alpha, m, s, a.p + off), s.n_iter,
                      s.converged);
}

template <class Team, class T>
__device__ void budget_fwd(const Team& team, const er::RowForwardArgs<T>& a, long long row) {
    const long long off = row * (long long)a.n;
    er::RowReader<T> xr{a.x + off};
    er::FamilySolve s = er::budget_solve(team, xr, a.n, a.prm[row], a.max_iter);
    const long long k = er::budget_write(team, xr, a.n, s, a.p + off);
    er::store_results(team, a, row, s.tau, k, s.n_iter, s.converged);
}

}  // namespace

// The forward and VJP kernels, each as a warp-per-row and a block-per-row kernel
// (entmax_teams.cuh); the prm of the forward records is alpha (normmax) or the budget.
ER_ROW_KERNELS(template <typename T>, normmax_forward, er::RowForwardArgs<T>, a.rows, normmax_fwd(team, a, row);)

ER_VJP_KERNELS(normmax_vjp, er::normmax_vjp_row)

ER_ROW_KERNELS(template <typename T>, budget_forward, er::RowForwardArgs<T>, a.rows, budget_fwd(team, a, row);)

ER_ROW_KERNELS(template <typename T>, budget_vjp, er::RowVjpArgs<T>, a.rows,
               const long long off = row * (long long)a.n;
               er::budget_vjp_row(team, a.p + off, a.g + off, a.n, a.dx + off);)
