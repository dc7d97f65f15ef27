// entmax_attention.cu -- the row kernels of the cupy backend's query-chunked attention.
//
// The matrix products (q k^T, p v, dO v^T, ...) are cuBLAS calls made by cupy_backend.py,
// in float64 whatever the input's dtype (as the CPU engines score, so that the supports are
// theirs); these kernels do the per-row work between them, on a chunk of R score rows laid
// out as (B, Hkv, group, chunk) with Kend keys each, all float64.  Row r is query
// i0 + (r % chunk) of query head (r / chunk % (Hkv * group)) in batch
// r / (chunk * Hkv * group).  Scores are built exactly as backends/numpy_attention.py
// builds them (er::ScoreRow in entmax_core.cuh).  Each kernel takes one argument record.
#include "entmax_teams.cuh"

namespace er {

// The geometry of a chunk's score rows and the terms of their scores.
struct AttnChunk {
    const double* row_scale;        // (B, Hq, Nq) ASEntmax row scale, or null
    const double* slopes;           // (Hq,) ALiBi slopes, or null
    const long long* key_lengths;   // (B,), or null
    long long rows;                 // R = B * Hq * chunk
    long long i0, nq, offset;       // the chunk's first query, Nq, Nk - Nq
    double scale, alpha;
    int n_keys, chunk, heads, causal;
};

// attn_forward: solves each score row, writes p over the raw q.k products (same index),
// u = p^(2-alpha) (alpha > 2: u / max u) into u, and per row theta, support, sum u and the
// edge residual; bad is set to 1 on a non-finite visible score, 2 on an unconverged row.
struct AttnForwardArgs {
    AttnChunk c;
    double* dots;         // (R, Kend): q.k in, p out
    double* u;            // (R, Kend)
    double* theta;        // (B, Hq, Nq), and the same for the four below
    long long* support;
    double* row_max;
    double* edge;
    double* edge_p;
    double* sum_u;        // (R,)
    int* bad;             // one flag for the launch
    long long max_iter;
};

// attn_backward: from the forward's residual (theta; for alpha > 2 the edge), p over the
// raw q.k products and, over dp = dO . v_j, the scaled score gradient s_i * dZ_ij, and per
// row ds_i = sum_j dZ_ij a_ij into ds (when not null).
struct AttnBackwardArgs {
    AttnChunk c;
    double* dots;             // (R, Kend): q.k in, p out
    double* dp;               // (R, Kend): dO . v_j in, s_i * dZ_ij out
    const double* theta;      // (B, Hq, Nq), and the same for the three below
    const double* row_max;
    const double* edge;
    const double* edge_p;
    const double* delta;      // (R,): dO . skew
    double* ds;               // (B, Hq, Nq) or null
};

// attn_probs_from_theta / attn_probs_from_edge: p over the raw q.k products and the skew
// weights u, with sum u per row, from the forward's residual (the backward when no skewed
// output was kept).
struct AttnProbsArgs {
    AttnChunk c;
    double* dots;             // (R, Kend): q.k in, p out
    double* u;                // (R, Kend)
    const double* theta;      // (B, Hq, Nq), and the same for the three below
    const double* row_max;
    const double* edge;
    const double* edge_p;
    double* sum_u;            // (R,)
};

// narrow_to_float: out[i] = in[i] rounded to float32 (er::store), subnormals kept.
struct NarrowArgs {
    const double* in;
    float* out;
    long long n;
};

}  // namespace er

namespace {

struct RowIndex {
    int b, h;
    long long i, out;  // query index in [0, Nq) and the flat (b, h, i) index of outputs
};

// Score row r of a chunk: its index, its offset in the chunk's (R, Kend) arrays and its
// scores (built as the NumPy driver builds them).
struct ChunkRow {
    RowIndex ix;
    long long off;
    er::ScoreRow<double> z;
};

__device__ inline ChunkRow chunk_row(const er::AttnChunk& c, const double* dots, long long r) {
    ChunkRow cr;
    const long long bh = r / c.chunk;
    cr.ix.i = c.i0 + r % c.chunk;
    cr.ix.h = (int)(bh % c.heads);
    cr.ix.b = (int)(bh / c.heads);
    cr.ix.out = ((long long)cr.ix.b * c.heads + cr.ix.h) * c.nq + cr.ix.i;
    cr.off = r * (long long)c.n_keys;
    cr.z = er::score_row<double>(dots + cr.off, c.n_keys, c.scale, c.row_scale ? c.row_scale + cr.ix.out : nullptr,
                                 c.slopes, c.key_lengths, c.causal != 0, cr.ix.b, cr.ix.h, cr.ix.i, c.offset);
    return cr;
}

template <class Team>
__device__ void attn_forward_row(const Team& team, const er::AttnForwardArgs& a, long long r) {
    const ChunkRow cr = chunk_row(a.c, a.dots, r);
    const int n = a.c.n_keys;
    double nonfinite[1];
    team.template reduce_sum<1>(n, [&](int j, er::Acc<1>& acc) {
        double v = cr.z(j);
        if (j < cr.z.limit && !er::is_finite(v)) acc.add(0, 1.0);
    }, nonfinite);
    if (nonfinite[0] > 0.0) {
        if (team.leader()) atomicExch(a.bad, 1);
        return;
    }
    er::Solve s = er::solve_row(team, cr.z, n, a.c.alpha, er::METHOD_DEFAULT, (int)a.max_iter);
    er::EdgeResidual e = er::edge_residual(team, cr.z, n, a.c.alpha, s);
    double su;
    long long k = er::write_probs_weights(team, cr.z, n, a.c.alpha, s, a.dots + cr.off, a.u + cr.off, su);
    if (team.leader()) {
        a.theta[cr.ix.out] = s.theta;
        a.support[cr.ix.out] = k;
        a.sum_u[r] = su;
        a.row_max[cr.ix.out] = e.m;
        a.edge[cr.ix.out] = e.c;
        a.edge_p[cr.ix.out] = e.q;
        if (!s.converged) atomicExch(a.bad, 2);
    }
}

template <class Team>
__device__ void attn_backward_row(const Team& team, const er::AttnBackwardArgs& a, long long r) {
    const ChunkRow cr = chunk_row(a.c, a.dots, r);
    const er::EdgeResidual e = {a.row_max[cr.ix.out], a.edge[cr.ix.out], a.edge_p[cr.ix.out]};
    const double d = er::attn_grad_row(team, cr.z, [&](int j) { return cr.z.a(j); }, a.c.n_keys, a.c.alpha,
                                       a.theta[cr.ix.out], e, a.delta[r], cr.z.s, cr.z.has_s, a.dots + cr.off,
                                       a.dp + cr.off);
    if (a.ds != nullptr && team.leader()) a.ds[cr.ix.out] = d;
}

}  // namespace

// The forward and the backward, each as a warp-per-row and a block-per-row kernel
// (entmax_teams.cuh).
ER_ROW_KERNELS(, attn_forward, er::AttnForwardArgs, a.c.rows, attn_forward_row(team, a, row);)

ER_ROW_KERNELS(, attn_backward, er::AttnBackwardArgs, a.c.rows, attn_backward_row(team, a, row);)

// Probabilities and skew weights from theta (the backward when no skewed output was kept),
// alpha <= 2.
__global__ void __launch_bounds__(ER_MAX_BLOCK) attn_probs_from_theta_block(const er::AttnProbsArgs a) {
    ER_BLOCK_ROW(a.c.rows)
    const ChunkRow cr = chunk_row(a.c, a.dots, row);
    const er::Alpha al = er::make_alpha(a.c.alpha);
    const double th = a.theta[cr.ix.out];
    double out[1];
    team.template reduce_sum<1>(a.c.n_keys, [&](int j, er::Acc<1>& acc) {
        er::Terms t = er::terms_from_theta(al, cr.z(j), th);
        acc.add(0, t.u);
        a.dots[cr.off + j] = t.p;
        a.u[cr.off + j] = t.u;
    }, out);
    if (team.leader()) a.sum_u[row] = out[0];
}

// The same for alpha > 2, from the edge residual (row max m, edge c, edge probability q):
// p = edge_p(d) with d the score's offset from the edge (er::edge_offset: within rounding
// of the edge it is the edge), weights u / max u = exp((2 - alpha)(log p - log q)), as the
// forward writes them (the largest u is at the edge entry, whose p is q).
__global__ void __launch_bounds__(ER_MAX_BLOCK) attn_probs_from_edge_block(const er::AttnProbsArgs a) {
    ER_BLOCK_ROW(a.c.rows)
    const ChunkRow cr = chunk_row(a.c, a.dots, row);
    const double a1 = a.c.alpha - 1.0, a2 = 2.0 - a.c.alpha;
    const bool live = a.theta[cr.ix.out] > -er::inf();
    const er::EdgeResidual e = {a.row_max[cr.ix.out], a.edge[cr.ix.out], a.edge_p[cr.ix.out]};
    const double lq = er::edge_lq(e.q, a1);
    const double lmax = e.q > 0.0 ? a2 * log(e.q) : 0.0;
    double out[1];
    team.template reduce_sum<1>(a.c.n_keys, [&](int j, er::Acc<1>& acc) {
        double zj = cr.z(j);
        double pj = live && zj > -er::inf() ? er::edge_p(er::edge_offset(zj, e), a1, e.q, lq) : 0.0;
        double u = pj > 0.0 ? exp(a2 * log(pj) - lmax) : 0.0;
        acc.add(0, u);
        a.dots[cr.off + j] = pj;
        a.u[cr.off + j] = u;
    }, out);
    if (team.leader()) a.sum_u[row] = out[0];
}

// The float64 results of an attention call rounded to float32 (the input's dtype), one
// element a thread over a grid-stride loop; with er::store, not CuPy's cast (compiled with
// -ftz=true, which would flush subnormal results to zero).
__global__ void __launch_bounds__(ER_MAX_BLOCK) narrow_to_float(const er::NarrowArgs a) {
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += step)
        a.out[i] = er::store<float>(a.in[i]);
}
