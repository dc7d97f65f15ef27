// harness_rows.cuh -- what the g++ harnesses of the CUDA cores share (harness.cpp for
// entmax_core.cuh, family_harness.cpp for family_core.cuh): the per-row results of a
// forward as the ctypes caller lays them out, and the run-time choice of a HostTeam's
// lane count, and the loop of one team over the rows.  Host-only: never included by a
// .cu file; include it after the core header (it uses er::HostTeam, er::RowReader).
#pragma once

namespace er_harness {

// One forward's (rows,) outputs: the threshold (theta or tau), the support size, the
// solver's iterations and whether it converged.
struct RowOutputs {
    double* threshold;
    long long* support;
    long long* n_iter;
    unsigned char* converged;

    template <class Solve>
    void set(long r, long long support_r, double threshold_r, const Solve& s) const {
        support[r] = support_r;
        threshold[r] = threshold_r;
        n_iter[r] = s.n_iter;
        converged[r] = s.converged ? 1 : 0;
    }
};

// body(team, row, r) for each row r of the (rows, n) array x, with one HostTeam<LANES>
// serving the rows in turn (as a kernel's team serves its row).
template <int LANES, class T, class Body>
void for_rows(const T* x, long rows, int n, Body body) {
    er::HostTeam<LANES> team;
    for (long r = 0; r < rows; ++r) body(team, er::RowReader<T>{x + r * n}, r);
}

}  // namespace er_harness

// Runs call(L) with L = lanes as a template argument (1: a serial loop, 32: a warp's
// reduction order, 256: a 256-thread block's) and returns 0; -1 for another lane count.
#define ER_BY_LANES(lanes, call)       \
    switch (lanes) {                   \
        case 1: call(1); return 0;     \
        case 32: call(32); return 0;   \
        case 256: call(256); return 0; \
        default: return -1;            \
    }
