// harness_rows.cuh -- what the g++ harnesses of the CUDA cores share (harness.cpp for
// entmax_core.cuh, family_harness.cpp for family_core.cuh): a CPU team with the reduction
// order of a warp or a block, the per-row results of a forward as the ctypes caller lays
// them out, the run-time choice of the team's lane count, and the loop of one team over
// the rows.  Include it after the core header (it uses er::Acc, er::RowReader).
#pragma once

namespace er_harness {

// Executes a row on the CPU with the same partition and reduction tree as the device
// teams (backends/cuda/entmax_teams.cuh): element i goes to lane i % LANES; lanes are
// reduced by a halving tree inside each group of 32 (what __shfl_xor_sync computes in every
// lane), then the groups are merged in order 0, 1, ... (what BlockTeam does through shared
// memory).  LANES = 1 is a plain serial loop.
template <int LANES>
struct HostTeam {
    bool leader() const { return true; }
    template <int K, class F>
    void reduce_sum(int n, F f, double out[K]) const {
        static er::Acc<K> lane[LANES];  // the harness is single-threaded
        for (int l = 0; l < LANES; ++l) lane[l].zero();
        for (int i = 0; i < n; ++i) f(i, lane[i % LANES]);
        const int W = LANES < 32 ? LANES : 32;
        for (int g = 0; g < LANES; g += W)
            for (int off = W / 2; off > 0; off /= 2)
                for (int l = 0; l < off; ++l) lane[g + l].merge(lane[g + l + off]);
        er::Acc<K> tot = lane[0];
        for (int g = W; g < LANES; g += W) tot.merge(lane[g]);
        for (int k = 0; k < K; ++k) out[k] = tot.get(k);
    }
    template <class F>
    double reduce_max(int n, F f) const {
        double m = -er::inf();
        for (int i = 0; i < n; ++i) m = er::dmax(m, f(i));
        return m;
    }
    template <class F>
    void for_each(int n, F f) const {
        for (int i = 0; i < n; ++i) f(i);
    }
};

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
    HostTeam<LANES> team;
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
