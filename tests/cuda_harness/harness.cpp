// harness.cpp -- runs the CUDA kernels' numerical core (entmax_core.cuh) on the CPU.
//
// Built by tests/cuda_cases.build_harness (for tests/test_cuda_core.py) with
//     g++ -std=c++17 -O2 -shared -fPIC $(cuda_defines()) -I backends/cuda tests/cuda_harness/harness.cpp -o harness.so
// (the -D options of backends/constants.py, the same ones NVRTC gets)
// and driven through ctypes.  Each entry point loops over rows exactly as the kernels do
// (one team per row) with a HostTeam whose lane count is chosen at run time: 1 (serial),
// 32 (the reduction order of a warp-per-row kernel) or 256 (a 256-thread block per row).
#include "entmax_core.cuh"
#include "harness_rows.cuh"

namespace {

template <int LANES, class T>
void forward_rows(const T* x, long rows, int n, const double* alpha, int method, int max_iter, T* p,
                  const er_harness::RowOutputs& out) {
    er_harness::for_rows<LANES>(x, rows, n, [&](const auto& team, const auto& row, long r) {
        er::Solve s = er::solve_row(team, row, n, alpha[r], method, max_iter);
        out.set(r, er::write_probs(team, row, n, alpha[r], s, p + r * n), s.theta, s);
    });
}

template <int LANES, class T>
void vjp_rows(const T* p, const T* g, long rows, int n, const double* alpha, T* dx) {
    er_harness::HostTeam<LANES> team;
    for (long r = 0; r < rows; ++r) er::vjp_row(team, p + r * n, g + r * n, n, alpha[r], dx + r * n);
}

template <int LANES, class T>
void alpha_vjp_rows(const T* p, const T* g, long rows, int n, const double* alpha, double* out) {
    er_harness::HostTeam<LANES> team;
    for (long r = 0; r < rows; ++r) out[r] = er::alpha_vjp_row(team, p + r * n, g + r * n, n, alpha[r]);
}

// The attention kernels' row math (entmax_attention.cu) on score rows z given directly
// (a = z, s = 1): forward solve and edge residual, then the backward from that residual
// with dp = dO . v_j given (overwritten by dZ) and delta = dO . skew.
template <int LANES>
void attn_rows(const double* z, long rows, int n, double alpha, int max_iter, const double* delta, double* p,
               double* dp, double* theta, double* row_max, double* edge, double* edge_p, double* ds) {
    er_harness::HostTeam<LANES> team;
    for (long r = 0; r < rows; ++r) {
        er::RowReader<double> row{z + r * n};
        er::Solve s = er::solve_row(team, row, n, alpha, er::METHOD_DEFAULT, max_iter);
        er::EdgeResidual e = er::edge_residual(team, row, n, alpha, s);
        theta[r] = s.theta;
        row_max[r] = e.m;
        edge[r] = e.c;
        edge_p[r] = e.q;
        ds[r] = er::attn_grad_row(team, row, row, n, alpha, s.theta, e, delta[r], 1.0, false, p + r * n, dp + r * n);
    }
}

}  // namespace

extern "C" {

#define ER_FWD(L) forward_rows<L>(x, rows, n, alpha, method, max_iter, p, out)
int er_forward_f64(const double* x, long rows, int n, const double* alpha, int method, int max_iter, int lanes,
                   double* p, double* theta, long long* support, long long* n_iter, unsigned char* converged) {
    const er_harness::RowOutputs out{theta, support, n_iter, converged};
    ER_BY_LANES(lanes, ER_FWD)
}
int er_forward_f32(const float* x, long rows, int n, const double* alpha, int method, int max_iter, int lanes,
                   float* p, double* theta, long long* support, long long* n_iter, unsigned char* converged) {
    const er_harness::RowOutputs out{theta, support, n_iter, converged};
    ER_BY_LANES(lanes, ER_FWD)
}

#define ER_VJP(L) vjp_rows<L>(p, g, rows, n, alpha, dx)
int er_vjp_f64(const double* p, const double* g, long rows, int n, const double* alpha, int lanes, double* dx) {
    ER_BY_LANES(lanes, ER_VJP)
}
int er_vjp_f32(const float* p, const float* g, long rows, int n, const double* alpha, int lanes, float* dx) {
    ER_BY_LANES(lanes, ER_VJP)
}

#define ER_AVJP(L) alpha_vjp_rows<L>(p, g, rows, n, alpha, out)
int er_alpha_vjp_f64(const double* p, const double* g, long rows, int n, const double* alpha, int lanes,
                     double* out) {
    ER_BY_LANES(lanes, ER_AVJP)
}
int er_alpha_vjp_f32(const float* p, const float* g, long rows, int n, const double* alpha, int lanes,
                     double* out) {
    ER_BY_LANES(lanes, ER_AVJP)
}

#define ER_ATTN(L) attn_rows<L>(z, rows, n, alpha, max_iter, delta, p, dp, theta, row_max, edge, edge_p, ds)
int er_attn_rows_f64(const double* z, long rows, int n, double alpha, int max_iter, int lanes, const double* delta,
                     double* p, double* dp, double* theta, double* row_max, double* edge, double* edge_p,
                     double* ds) {
    ER_BY_LANES(lanes, ER_ATTN)
}

}  // extern "C"
