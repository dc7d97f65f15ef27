// entmax_attention.cu -- the row kernels of the cupy backend's query-chunked attention.
//
// The matrix products (q k^T, p v, dO v^T, ...) are cuBLAS calls made by cupy_backend.py;
// these kernels do the per-row work between them, on a chunk of R score rows laid out as
// (B, Hkv, group, chunk) with Kend keys each.  Row r is query i0 + (r % chunk) of query
// head (r / chunk % (Hkv * group)) in batch r / (chunk * Hkv * group).  Scores are built
// exactly as backends/numpy_attention.py builds them (er::ScoreRow in entmax_core.cuh).
#include "entmax_teams.cuh"

#ifndef ER_MAX_BLOCK  // launch bound, from backends/constants.py (the adaptor never launches more)
#error "compile with the -D options of entmax_ref.backends.constants.cuda_defines()"
#endif

namespace {

struct RowIndex {
    int b, h;
    long long i, out;  // query index in [0, Nq) and the flat (b, h, i) index of outputs
};

__device__ inline RowIndex row_index(long long r, int chunk, int heads, long long i0, long long nq) {
    RowIndex ix;
    long long bh = r / chunk;
    ix.i = i0 + r % chunk;
    ix.h = (int)(bh % heads);
    ix.b = (int)(bh / heads);
    ix.out = ((long long)ix.b * heads + ix.h) * nq + ix.i;
    return ix;
}

// The parameters of every row kernel (and row function) after its two (R, Kend) arrays and
// its row count (or row): the chunk's geometry and the terms of its scores.
#define ER_CHUNK_PARAMS                                                                                      \
    int n_keys, int chunk, int heads, long long i0, long long nq, long long offset, double scale, double alpha, \
        const double *row_scale, const double *slopes, const long long *key_lengths, int causal
#define ER_CHUNK_ARGS n_keys, chunk, heads, i0, nq, offset, scale, alpha, row_scale, slopes, key_lengths, causal

// In a function of ER_CHUNK_PARAMS and `dots`: score row r's index `ix`, its offset `off`
// in the chunk's (R, Kend) arrays and its scores `z` (built as the NumPy driver builds them).
#define ER_CHUNK_ROW(r)                                                                                           \
    RowIndex ix = row_index((r), chunk, heads, i0, nq);                                                           \
    const long long off = (r) * (long long)n_keys;                                                                \
    er::ScoreRow<T> z = er::score_row<T>(dots + off, n_keys, scale, row_scale ? row_scale + ix.out : nullptr, slopes, \
                                         key_lengths, causal != 0, ix.b, ix.h, ix.i, offset);

// Forward: solve the row, write p over the raw dots (same index), u into u_out, and theta,
// support, sum u; flag a non-finite visible score (the reference raises ValueError).
template <class Team, class T>
__device__ void attn_forward_row(const Team& team, T* dots, T* u_out, long long r, ER_CHUNK_PARAMS, int max_iter,
                                 double* theta, long long* support, double* sum_u, double* row_max, double* edge,
                                 double* edge_p, int* bad) {
    ER_CHUNK_ROW(r)
    double nonfinite[1];
    team.template reduce_sum<1>(n_keys, [&](int j, er::Acc<1>& acc) {
        double v = z(j);
        if (j < z.limit && !er::is_finite(v)) acc.add(0, 1.0);
    }, nonfinite);
    if (nonfinite[0] > 0.0) {
        if (team.leader()) atomicExch(bad, 1);
        return;
    }
    er::Solve s = er::solve_row(team, z, n_keys, alpha, er::METHOD_DEFAULT, max_iter);
    er::EdgeResidual e = er::edge_residual(team, z, n_keys, alpha, s);
    double su;
    long long k = er::write_probs_weights(team, z, n_keys, alpha, s, dots + off, u_out + off, su);
    if (team.leader()) {
        theta[ix.out] = s.theta;
        support[ix.out] = k;
        sum_u[r] = su;
        row_max[ix.out] = e.m;
        edge[ix.out] = e.c;
        edge_p[ix.out] = e.q;
        if (!s.converged) atomicExch(bad, 2);
    }
}

// Backward: from the residual (theta; for alpha > 2 the edge), p over the raw dots and,
// over dp = dO . v_j, the scaled score gradient s_i * dZ_ij (er::attn_grad_row);
// ds_i = sum_j dZ_ij a_ij.
template <class Team, class T>
__device__ void attn_backward_row(const Team& team, T* dots, T* dp, long long r, ER_CHUNK_PARAMS,
                                  const double* theta, const double* row_max, const double* edge,
                                  const double* edge_p, const double* delta, double* ds) {
    ER_CHUNK_ROW(r)
    er::EdgeResidual e = {row_max[ix.out], edge[ix.out], edge_p[ix.out]};
    double d = er::attn_grad_row(team, z, [&](int j) { return z.a(j); }, n_keys, alpha, theta[ix.out], e, delta[r],
                                 z.s, z.has_s, dots + off, dp + off);
    if (ds != nullptr && team.leader()) ds[ix.out] = d;
}

}  // namespace

// The forward and the backward, each as a warp-per-row and a block-per-row kernel
// (entmax_teams.cuh).
ER_ROW_KERNELS(attn_forward,
               (T* dots, T* u_out, long long rows, ER_CHUNK_PARAMS, int max_iter, double* theta, long long* support,
                double* sum_u, double* row_max, double* edge, double* edge_p, int* bad),
               attn_forward_row(team, dots, u_out, row, ER_CHUNK_ARGS, max_iter, theta, support, sum_u, row_max, edge,
                                edge_p, bad);)

ER_ROW_KERNELS(attn_backward,
               (T* dots, T* dp, long long rows, ER_CHUNK_PARAMS, const double* theta, const double* row_max,
                const double* edge, const double* edge_p, const double* delta, double* ds),
               attn_backward_row(team, dots, dp, row, ER_CHUNK_ARGS, theta, row_max, edge, edge_p, delta, ds);)

// Probabilities and skew weights from theta (the backward when no skewed output was kept),
// alpha <= 2.
template <typename T>
__global__ void __launch_bounds__(ER_MAX_BLOCK) attn_probs_from_theta_block(T* dots, T* u_out, long long rows,
                                                                             ER_CHUNK_PARAMS, const double* theta,
                                                                             double* sum_u) {
    ER_BLOCK_ROW
    ER_CHUNK_ROW(row)
    er::Alpha al = er::make_alpha(alpha);
    const double th = theta[ix.out];
    double out[1];
    team.template reduce_sum<1>(n_keys, [&](int j, er::Acc<1>& acc) {
        er::Terms t = er::terms_from_theta(al, z(j), th);
        acc.add(0, t.u);
        dots[off + j] = er::store<T>(t.p);
        u_out[off + j] = er::store<T>(t.u);
    }, out);
    if (team.leader()) sum_u[row] = out[0];
}

// The same for alpha > 2, from the edge residual (row max m, edge c, edge probability q):
// p = edge_p((z - m) - c), weights u / max u = exp((2 - alpha)(log p - log q)), as the
// forward writes them (the largest u is at the edge entry, whose p is q).
template <typename T>
__global__ void __launch_bounds__(ER_MAX_BLOCK) attn_probs_from_edge_block(T* dots, T* u_out, long long rows,
                                                                            ER_CHUNK_PARAMS, const double* theta,
                                                                            const double* row_max, const double* edge,
                                                                            const double* edge_p, double* sum_u) {
    ER_BLOCK_ROW
    ER_CHUNK_ROW(row)
    const double a1 = alpha - 1.0, a2 = 2.0 - alpha;
    const bool live = theta[ix.out] > -er::inf();
    const double m = row_max[ix.out], c = edge[ix.out], q = edge_p[ix.out];
    const double lq = er::edge_lq(q, a1);
    const double lmax = q > 0.0 ? a2 * log(q) : 0.0;
    double out[1];
    team.template reduce_sum<1>(n_keys, [&](int j, er::Acc<1>& acc) {
        double zj = z(j);
        double pj = live && zj > -er::inf() ? er::edge_p((zj - m) - c, a1, q, lq) : 0.0;
        double u = pj > 0.0 ? exp(a2 * log(pj) - lmax) : 0.0;
        acc.add(0, u);
        dots[off + j] = er::store<T>(pj);
        u_out[off + j] = er::store<T>(u);
    }, out);
    if (team.leader()) sum_u[row] = out[0];
}
