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
                            const er::RowResults& out) {
    const long long off = row * (long long)n;
    er::RowReader<T> xr{x + off};
    er::Solve s = er::solve_row(team, xr, n, alpha[row], method, max_iter);
    long long k = er::write_probs(team, xr, n, alpha[row], s, p + off);
    out.store(team, row, s.theta, k, s.n_iter, s.converged);
}

}  // namespace

// The forward and the two VJPs, each as a warp-per-row and a block-per-row kernel
// (entmax_teams.cuh).
ER_ROW_KERNELS(entmax_forward,
               (const T* __restrict__ x, long long rows, int n, const double* __restrict__ alpha, int method,
                int max_iter, ER_FORWARD_OUTPUTS),
               forward_row(team, x, row, n, alpha, method, max_iter, p, ER_FORWARD_RESULTS);)

ER_VJP_KERNELS(entmax_vjp, er::vjp_row)

ER_ROW_KERNELS(entmax_alpha_vjp,
               (const T* __restrict__ p, const T* __restrict__ g, long long rows, int n,
                const double* __restrict__ alpha, double* __restrict__ out),
               const long long off = row * (long long)n;
               double r = er::alpha_vjp_row(team, p + off, g + off, n, alpha[row]);
               if (team.leader()) out[row] = r;)
