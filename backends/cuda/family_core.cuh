// family_core.cuh -- numerical core of the alpha-normmax and budget-sparsemax kernels.
//
// __host__ __device__ and templated on the team (entmax_teams.cuh on the GPU; on the CPU
// the tests run these very functions under g++ with a team of the same reduction order,
// tests/cuda_harness/), so every reduction has the same order on both.  There is no sort
// on the GPU, so both solve on the whole row with team reductions, to the answer of the
// sort-based reference (backends/numpy_family.py) up to rounding; all arithmetic is float64.
//
// normmax (alpha > 1, beta = alpha/(alpha-1), y = x - max x): phi(T) = ||[y - T]_+||_beta - 1
// is convex (a monotone norm of convex functions of T) and decreasing on T < 0, and
// phi(-1) >= 0 (the top entry alone).  Newton from T = -1 therefore increases monotonically
// to the root; it stops when phi <= 0 or a step no longer increases T (full precision), and
// the support is {y_i > T}.  One pass per step computes sum r^beta and sum r^(beta-1) with
// r = (y - T)_+ / (-T) (scaled by the top term, so nothing overflows).
// p_i = r_i^(1/(alpha-1)) / sum_j r_j^(1/(alpha-1)); tau = max x + T.
//
// budget (0 <= B <= n): h(t) = sum_i clip(x_i - t, 0, 1) is nonincreasing and piecewise
// linear with breakpoints x_i and x_i - 1; tau solves h(tau) = B.  At any magnitude: float64
// numbers 2^53 and more apart from 1 have no room for t between x_i and x_i - 1, so the
// solve works relative to an entry.  First the anchor H, the smallest entry with
// h(H) <= B, by bisection on the entries' order keys (the double's bits, ordered as the
// values): the entry with the largest key at or below the middle key of the bracket
// (L, H] of entries (or the smallest inside it) halves the bracket; h is evaluated at
// entries only, where x_i - H is exact whenever it is below 1 in size (Sterbenz), and
// tau lies in (H - 1, H].  Then, on d_i = x_i - H clamped to [-4, 4] (which changes no
// clip(d_i - r, 0, 1) for r in [-2, 2]): the bracket lo = min d - 1, hi = max d is shrunk
// -- at the largest breakpoint c inside it when c is in its lower half, else at its
// midpoint -- until no breakpoint lies strictly inside; then, with U = {d_i - 1 >= hi} and
// F = {d_i >= hi, d_i - 1 <= lo} (all within 1 of hi), r = hi + (|U| + sum_F (d_i - hi) -
// B) / |F|, clamped to [lo, hi], and p_i = clip(d_i - r, 0, 1), tau = H + r.  At most B
// finite entries: tau = -inf, p = 1 on them.
#pragma once
#include "entmax_core.cuh"

namespace er {

struct FamilySolve {
    double tau;
    double rel;   // tau - base, kept unrounded (tau itself may round it away)
    double base;  // normmax: max x; budget: the anchor entry H
    long long n_iter;
    bool converged;
};

// ------------------------------------------------------------------------ normmax
template <class Team, class Row>
ER_HD FamilySolve normmax_solve(const Team& team, const Row& x, int n, double alpha, int max_iter, double* m_out) {
    const double m = team.reduce_max(n, [&](int i) { return x(i); });
    *m_out = m;
    FamilySolve s{-inf(), 0.0, m, 0, true};
    if (!(m > -inf())) return s;
    const double beta = alpha / (alpha - 1.0);
    double T = -1.0;
    s.converged = false;
    for (int it = 0; it < max_iter; ++it) {
        const double top = -T;
        double sums[2];
        team.template reduce_sum<2>(n, [&](int i, Acc<2>& a) {
            const double r = (x(i) - m - T) / top;
            if (r > 0.0) {
                const double lr = log(r);
                a.add(0, exp(beta * lr));
                a.add(1, exp((beta - 1.0) * lr));
            }
        }, sums);
        const double lsr = log(sums[0]) / beta;  // log(norm / top)
        const double norm = top * exp(lsr);
        if (!(norm > 1.0)) {
            s.converged = true;
            break;
        }
        // -phi'(T) = sum (t_i / norm)^(beta - 1) = (top / norm)^(beta - 1) sum r^(beta - 1)
        const double slope = exp(-(beta - 1.0) * lsr) * sums[1];
        double nxt = T + (norm - 1.0) / slope;
        if (nxt > 0.0) nxt = 0.0;
        if (!(nxt > T)) {
            s.converged = true;
            break;
        }
        T = nxt;
        s.n_iter = it + 1;
    }
    s.tau = m + T;
    s.rel = T;
    return s;
}

template <class Team, class Row, class T>
ER_HD long long normmax_write(const Team& team, const Row& x, int n, double alpha, double m, const FamilySolve& s,
                              T* p) {
    if (!(s.tau > -inf())) {
        team.for_each(n, [&](int i) { p[i] = T(0); });
        return 0;
    }
    const double Tm = s.rel;  // in [-1, 0)
    const double g = 1.0 / (alpha - 1.0);
    double S[1];
    team.template reduce_sum<1>(n, [&](int i, Acc<1>& a) {
        const double r = (x(i) - m - Tm) / -Tm;
        if (r > 0.0) a.add(0, exp(g * log(r)));
    }, S);
    double cnt[1];
    team.template reduce_sum<1>(n, [&](int i, Acc<1>& a) {
        const double r = (x(i) - m - Tm) / -Tm;
        const double v = r > 0.0 ? exp(g * log(r)) / S[0] : 0.0;
        p[i] = store<T>(v);
        if (v > 0.0) a.add(0, 1.0);
    }, cnt);
    return (long long)cnt[0];
}

// dx = v (g - <p, g>) - p (v . (g - <p, g>)), v = N (p/N)^(2-alpha) / (alpha-1), N = ||p||_alpha.
template <class Team, class T>
ER_HD void normmax_vjp_row(const Team& team, const T* p, const T* g, int n, double alpha, T* dx) {
    const double top = team.reduce_max(n, [&](int i) { return load(p[i]); });
    if (!(top > 0.0)) {
        team.for_each(n, [&](int i) { dx[i] = T(0); });
        return;
    }
    double s1[2];
    team.template reduce_sum<2>(n, [&](int i, Acc<2>& a) {
        const double pi = load(p[i]);
        if (pi > 0.0) {
            a.add(0, pi * load(g[i]));
            a.add(1, exp(alpha * log(pi / top)));
        }
    }, s1);
    const double pg = s1[0];
    // v = N (p/N)^(2-alpha) / (alpha-1) = exp(c0 + (2-alpha) log p)
    const double c0 = (alpha - 1.0) * (log(top) + log(s1[1]) / alpha) - log(alpha - 1.0);
    const double a2 = 2.0 - alpha;
    auto v_of = [&](double pi) { return exp(c0 + a2 * log(pi)); };
    double s2[1];
    team.template reduce_sum<1>(n, [&](int i, Acc<1>& a) {
        const double pi = load(p[i]);
        if (pi > 0.0) a.add(0, v_of(pi) * (load(g[i]) - pg));
    }, s2);
    team.for_each(n, [&](int i) {
        const double pi = load(p[i]);
        dx[i] = pi > 0.0 ? store<T>(v_of(pi) * (load(g[i]) - pg) - pi * s2[0]) : T(0);
    });
}

// ------------------------------------------------------------------------ budget
// The row's entries relative to the anchor H, clamped to [-4, 4] (-inf stays -inf).
template <class Row>
struct AnchoredRow {
    const Row& x;
    double H;
    ER_HD double operator()(int i) const {
        const double v = x(i);
        if (!(v > -inf())) return v;
        const double d = v - H;
        return d < -4.0 ? -4.0 : d > 4.0 ? 4.0 : d;
    }
};

template <class Team, class Row>
ER_HD double budget_h(const Team& team, const Row& x, int n, double t) {
    double h[1];
    team.template reduce_sum<1>(n, [&](int i, Acc<1>& a) {
        const double v = x(i);
        if (v > -inf()) {
            const double c = v - t;
            a.add(0, c <= 0.0 ? 0.0 : c >= 1.0 ? 1.0 : c);
        }
    }, h);
    return h[0];
}

// A double's bits as an unsigned integer of the same order (no NaN here).
ER_HD inline unsigned long long order_key(double v) {
#ifdef __CUDA_ARCH__
    const unsigned long long b = (unsigned long long)__double_as_longlong(v);
#else
    unsigned long long b;
    __builtin_memcpy(&b, &v, 8);
#endif
    return b >> 63 ? ~b : b | 0x8000000000000000ULL;
}

// The anchor H (see the file's header): the smallest entry with h(H) <= B, given that the
// row has more than B finite entries.
template <class Team, class Row>
ER_HD double budget_anchor(const Team& team, const Row& x, int n, double B, int max_iter, FamilySolve& s) {
    double L = -inf(), H = team.reduce_max(n, [&](int i) { return x(i); });  // h(L) > B >= h(H) = 0
    for (;; ++s.n_iter) {
        if (s.n_iter >= max_iter) {
            s.converged = false;
            return H;
        }
        const unsigned long long kl = order_key(L), km = kl + (order_key(H) - kl) / 2;
        double pivot = team.reduce_max(n, [&](int i) {
            const double v = x(i);
            return v > L && v < H && order_key(v) <= km ? v : -inf();
        });
        if (!(pivot > -inf())) {  // none in the lower half: the smallest entry inside, if any
            pivot = -team.reduce_max(n, [&](int i) {
                const double v = x(i);
                return v > L && v < H ? -v : -inf();
            });
            if (!(pivot < inf())) return H;
        }
        if (budget_h(team, x, n, pivot) > B)
            L = pivot;
        else
            H = pivot;
    }
}

// tau - H on the anchored row d (see the file's header); d's entries lie in [-4, 4].
template <class Team, class Row>
ER_HD double budget_piece(const Team& team, const Row& d, int n, double B, int max_iter, FamilySolve& s) {
    double lo = -team.reduce_max(n, [&](int i) { const double v = d(i); return v > -inf() ? -v : -inf(); }) - 1.0;
    double hi = team.reduce_max(n, [&](int i) { return d(i); });  // h(lo) = #finite > B >= 0 = h(hi)
    s.converged = false;
    for (; s.n_iter < max_iter; ++s.n_iter) {
        // the largest breakpoint strictly inside (lo, hi); none: the piece is found
        const double c = team.reduce_max(n, [&](int i) {
            const double v = d(i);
            const double w = v - 1.0;
            return (v > lo && v < hi) ? v : (w > lo && w < hi) ? w : -inf();
        });
        if (!(c > -inf())) {
            s.converged = true;
            break;
        }
        // the breakpoint if it is in the lower half (then the next step ends or halves),
        // else the midpoint (the bracket halves)
        const double mid = lo + 0.5 * (hi - lo);
        const double pivot = c <= mid ? c : mid;
        if (budget_h(team, d, n, pivot) > B)
            lo = pivot;
        else
            hi = pivot;
    }
    // the closed form relative to m = hi: the free entries lie in [hi, lo + 1], within 1 of it
    const double m = hi;
    // U: entries at 1 or more above m (sum 0 counts them); F: the free entries in
    // [m, lo + 1] not in U (sum 1 counts them, sum 2 adds up their v - m)
    const auto in_U = [&](double v) { return v - 1.0 >= m; };
    // (not a generic lambda taking the accumulator: NVRTC compiles those as host code)
    const auto in_F = [&](double v) { return v >= m && v - 1.0 <= lo && !in_U(v); };
    double sums[3];
    team.template reduce_sum<3>(n, [&](int i, Acc<3>& a) {
        const double v = d(i);
        if (in_U(v)) {
            a.add(0, 1.0);
        } else if (in_F(v)) {
            a.add(1, 1.0);
            a.add(2, v - m);
        }
    }, sums);
    const double nU = sums[0], nF = sums[1], sF = sums[2];
    // F is not empty when h(lo) > h(hi) (a guard only against an impossible division)
    double r = nF > 0.0 ? m + (nU + sF - B) / nF : m;
    if (r < lo) r = lo;
    if (r > hi) r = hi;
    return r;
}

template <class Team, class Row>
ER_HD FamilySolve budget_solve(const Team& team, const Row& x, int n, double B, int max_iter) {
    FamilySolve s{-inf(), 0.0, 0.0, 0, true};
    double cnt[1];
    team.template reduce_sum<1>(n, [&](int i, Acc<1>& a) { if (x(i) > -inf()) a.add(0, 1.0); }, cnt);
    if (cnt[0] <= B) return s;  // every unmasked entry is 1 (none on all -inf rows)
    s.base = budget_anchor(team, x, n, B, max_iter, s);
    s.rel = budget_piece(team, AnchoredRow<Row>{x, s.base}, n, B, max_iter, s);
    s.tau = s.base + s.rel;
    return s;
}

// p_i = clip(d_i - r, 0, 1) on the anchored row; all 1 on the unmasked entries when
// tau = -inf.
template <class Team, class Row, class T>
ER_HD long long budget_write(const Team& team, const Row& x, int n, const FamilySolve& s, T* p) {
    const AnchoredRow<Row> d{x, s.base};
    const bool all = !(s.tau > -inf());
    double cnt[1];
    team.template reduce_sum<1>(n, [&](int i, Acc<1>& a) {
        const double v = d(i);
        double q = 0.0;
        if (v > -inf()) {
            const double c = all ? 1.0 : v - s.rel;
            q = c <= 0.0 ? 0.0 : c >= 1.0 ? 1.0 : c;
        }
        p[i] = store<T>(q);
        if (q > 0.0) a.add(0, 1.0);
    }, cnt);
    return (long long)cnt[0];
}

// dx_i = g_i - mean_F(g) on F = {0 < p < 1}, 0 elsewhere.
template <class Team, class T>
ER_HD void budget_vjp_row(const Team& team, const T* p, const T* g, int n, T* dx) {
    double s[2];
    team.template reduce_sum<2>(n, [&](int i, Acc<2>& a) {
        const double pi = load(p[i]);
        if (pi > 0.0 && pi < 1.0) {
            a.add(0, load(g[i]));
            a.add(1, 1.0);
        }
    }, s);
    const double mean = s[1] > 0.0 ? s[0] / s[1] : 0.0;
    team.for_each(n, [&](int i) {
        const double pi = load(p[i]);
        dx[i] = (pi > 0.0 && pi < 1.0) ? store<T>(load(g[i]) - mean) : T(0);
    });
}

}  // namespace er
