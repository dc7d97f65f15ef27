// entmax_rows.cu -- row-wise alpha-entmax kernels of the cupy backend.
//
// Inputs are C-contiguous (rows, n) arrays of T (float or double); alpha is one float64
// per row.  *_warp kernels give each row one warp (blockDim.x = 32 * rows per block),
// *_block kernels one block (blockDim.x a multiple of 32, at most ER_MAX_BLOCK).  Each
// kernel takes one argument record (entmax_teams.cuh); the per-row work is the
// __host__ __device__ core in entmax_core.cuh, see that file for the math.
#include "entmax_teams.cuh"

namespace {

template <class Team, class T>
__device__ void forward_row(const Team& team, const er::RowForwardArgs<T>& a, long long row) {
    const long long off = row * (long long)a.n;
    er::RowReader<T> xr{a.x + off};
    er::Solve s = er::solve_row(team, xr, a.n, a.prm[row], a.method, a.max_iter);
    long long k = er::write_probs(team, xr, a.n, a.prm[row], s, a.p + off);
    er::store_results(team, a, row, s.theta, k, s.n_iter, s.converged);
}

}  // namespace

// The forward and the two VJPs, each as a warp-per-row and a block-per-row kernel
// (entmax_teams.cuh).
ER_ROW_KERNELS(template <typename T>, entmax_forward, er::RowForwardArgs<T>, a.rows, forward_row(team, a, row);)

ER_VJP_KERNELS(entmax_vjp, er::vjp_row)

ER_ROW_KERNELS(template <typename T>, entmax_alpha_vjp, er::RowVjpArgs<T>, a.rows,
               const long long off = row * (long long)a.n;
               const double r = er::alpha_vjp_row(team, a.p + off, a.g + off, a.n, a.prm[row]);
               if (team.leader()) a.dalpha[row] = r;)
