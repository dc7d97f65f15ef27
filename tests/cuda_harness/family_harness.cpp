// family_harness.cpp -- runs the normmax / budget-sparsemax core (family_core.cuh) on the CPU.
//
// Built by tests/cuda_cases.build_harness (for tests/test_cuda_family_core.py) with
//     g++ -std=c++17 -O2 -shared -fPIC $(cuda_defines()) -I backends/cuda tests/cuda_harness/family_harness.cpp -o family_harness.so
// and driven through ctypes, as harness.cpp is for entmax: one HostTeam per row whose lane
// count (1, 32 or 256) reproduces a serial loop, a warp's or a 256-thread block's reductions.
#include "family_core.cuh"
#include "harness_rows.cuh"

namespace {

using er_harness::RowOutputs;

template <int LANES>
void normmax_rows(const double* x, long rows, int n, const double* alpha, int max_iter, double* p,
                  const RowOutputs& out) {
    er_harness::for_rows<LANES>(x, rows, n, [&](const auto& team, const auto& row, long r) {
        double m;
        er::FamilySolve s = er::normmax_solve(team, row, n, alpha[r], max_iter, &m);
        out.set(r, er::normmax_write(team, row, n, alpha[r], m, s, p + r * n), s.tau, s);
    });
}

template <int LANES>
void budget_rows(const double* x, long rows, int n, const double* budget, int max_iter, double* p,
                 const RowOutputs& out) {
    er_harness::for_rows<LANES>(x, rows, n, [&](const auto& team, const auto& row, long r) {
        er::FamilySolve s = er::budget_solve(team, row, n, budget[r], max_iter);
        out.set(r, er::budget_write(team, row, n, s, p + r * n), s.tau, s);
    });
}

template <int LANES>
void normmax_vjp_rows(const double* p, const double* g, long rows, int n, const double* alpha, double* dx) {
    er_harness::HostTeam<LANES> team;
    for (long r = 0; r < rows; ++r) er::normmax_vjp_row(team, p + r * n, g + r * n, n, alpha[r], dx + r * n);
}

template <int LANES>
void budget_vjp_rows(const double* p, const double* g, long rows, int n, double* dx) {
    er_harness::HostTeam<LANES> team;
    for (long r = 0; r < rows; ++r) er::budget_vjp_row(team, p + r * n, g + r * n, n, dx + r * n);
}

}  // namespace

extern "C" {

#define ER_NM(L) normmax_rows<L>(x, rows, n, prm, max_iter, p, out)
int er_normmax_f64(const double* x, long rows, int n, const double* prm, int max_iter, int lanes, double* p,
                   double* tau, long long* support, long long* n_iter, unsigned char* converged) {
    const RowOutputs out{tau, support, n_iter, converged};
    ER_BY_LANES(lanes, ER_NM)
}

#define ER_BS(L) budget_rows<L>(x, rows, n, prm, max_iter, p, out)
int er_budget_f64(const double* x, long rows, int n, const double* prm, int max_iter, int lanes, double* p,
                  double* tau, long long* support, long long* n_iter, unsigned char* converged) {
    const RowOutputs out{tau, support, n_iter, converged};
    ER_BY_LANES(lanes, ER_BS)
}

#define ER_NMV(L) normmax_vjp_rows<L>(p, g, rows, n, alpha, dx)
int er_normmax_vjp_f64(const double* p, const double* g, long rows, int n, const double* alpha, int lanes,
                       double* dx) {
    ER_BY_LANES(lanes, ER_NMV)
}

#define ER_BSV(L) budget_vjp_rows<L>(p, g, rows, n, dx)
int er_budget_vjp_f64(const double* p, const double* g, long rows, int n, int lanes, double* dx) {
    ER_BY_LANES(lanes, ER_BSV)
}

}  // extern "C"
