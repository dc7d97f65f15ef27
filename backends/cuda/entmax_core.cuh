// entmax_core.cuh -- the numerical core of the cupy backend's kernels.
//
// Everything here is __host__ __device__ (ER_HD) and free of CUDA intrinsics, so the very
// same functions run inside the CUDA kernels (entmax_rows.cu, entmax_attention.cu) and on
// the CPU, where the tests compile them with g++ (tests/cuda_harness/).  The only thing
// that differs between the two is the *team* that executes a row: a warp or a block on
// the GPU, a serial loop that reproduces the lane/warp reduction order on the CPU.
//
// Units (see backends/_base.py): a row x is shifted by its maximum m, y = x - m, and the
// solver finds A >= 0 with sum_i e_alpha(y_i - A) = 1; theta = m + A and
// p_i = e_alpha(y_i - A), e_alpha(d) = [1 + (alpha-1) d]_+^(1/(alpha-1)) (exp at alpha=1).
// For alpha > 2 the offset form cancels when p is small, so the solver variable is the
// support threshold v = A - 1/(alpha-1) and p_i = [(alpha-1)(y_i - v)]_+^(1/(alpha-1)),
// and the probabilities are then solved relative to the edge of the support, in the edge
// probability q and in log space (solve_row, edge_p), exactly as numpy_backend.py does; the
// VJPs for alpha > 2 use the reference's overflow-free forms (vjp_row_big, alpha_vjp_row).
// All arithmetic is float64 whatever the storage type T.
#pragma once

// Numeric constants come from backends/constants.py as -D defines (cuda_defines()), passed
// by the cupy loader to NVRTC, by the tests to nvcc and to g++; never typed here.
#if !defined(ER_SERIES_TERMS) || !defined(ER_EDGE_ULPS) || !defined(ER_EDGE_TIE_ULPS)
#error "compile with the -D options of entmax_ref.backends.constants.cuda_defines()"
#endif

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define ER_HD __host__ __device__
#else
#define ER_HD
#include <math.h>
#endif

namespace er {

// ------------------------------------------------------------------------ small helpers
#ifdef __CUDA_ARCH__  // NVRTC has no __builtin_huge_val
ER_HD inline double inf() { return __longlong_as_double(0x7ff0000000000000LL); }
#else
ER_HD inline double inf() { return __builtin_huge_val(); }
#endif
ER_HD inline bool is_finite(double v) { return (v - v) == 0.0; }  // false for +-inf, nan
ER_HD inline double dmax(double a, double b) { return a > b ? a : b; }

// ------------------------------------------------------------------------ storage types
// Every float32 value a kernel reads becomes a double through load(), and every double it
// stores as float32 goes through store<float>() (round to nearest even).  CuPy compiles
// every kernel with -ftz=true appended to the options it is given (the last one wins),
// which makes every float32 instruction the compiler emits flush subnormals to zero,
// conversions and comparisons included; on the device these two are one conversion each,
// written out in PTX without .ftz, so a float32 probability of 3.8e-44 stays 3.8e-44 as on
// the CPU (on the host they are plain casts, which keep subnormals too).  No other float32
// instruction is left: all arithmetic is float64.  tests/test_cuda_nvrtc.py reads the PTX
// under CuPy's options for a .ftz instruction that touches the kernels' values.
ER_HD inline double load(double v) { return v; }
ER_HD inline double load(float v) {
#ifdef __CUDA_ARCH__
    double d;
    asm("cvt.f64.f32 %0, %1;" : "=d"(d) : "f"(v));
    return d;
#else
    return (double)v;
#endif
}

template <class T>
ER_HD inline T store(double v);
template <>
ER_HD inline double store<double>(double v) { return v; }
template <>
ER_HD inline float store<float>(double v) {
#ifdef __CUDA_ARCH__
    float f;
    asm("cvt.rn.f32.f64 %0, %1;" : "=f"(f) : "d"(v));
    return f;
#else
    return (float)v;
#endif
}

// Compensated accumulators: each of K running sums is kept as (s, c) with s + c the value;
// adds are Knuth's TwoSum, so a sum is exact to about one rounding whatever the order.
template <int K>
struct Acc {
    double s[K];
    double c[K];
    ER_HD void zero() {
        for (int k = 0; k < K; ++k) s[k] = c[k] = 0.0;
    }
    ER_HD void add(int k, double v) {
        double t = s[k] + v;
        double bp = t - s[k];
        c[k] += (s[k] - (t - bp)) + (v - bp);
        s[k] = t;
    }
    // Merge another partial sum; symmetric in (this, o) bit for bit (TwoSum is exact).
    ER_HD void merge_one(int k, double os, double oc) {
        double t = s[k] + os;
        double bp = t - s[k];
        double e = (s[k] - (t - bp)) + (os - bp);
        s[k] = t;
        c[k] = (c[k] + oc) + e;
    }
    ER_HD void merge(const Acc& o) {
        for (int k = 0; k < K; ++k) merge_one(k, o.s[k], o.c[k]);
    }
    ER_HD double get(int k) const { return s[k] + c[k]; }
};

// ------------------------------------------------------------------------ alpha
enum Mode { SOFTMAX = 0, SPARSEMAX = 1, ENTMAX15 = 2, GENERAL = 3, GENERAL_GT2 = 4 };
enum Method { METHOD_DEFAULT = 0, METHOD_BISECT = 1 };

struct Alpha {
    double a, a1;    // alpha and alpha - 1
    double shift;    // A = v + shift: 1/(alpha-1) for alpha > 2, else 0
    int mode;
    bool halley;     // Halley steps are safe (f'' bounded at the support's edge): alpha < 1.5
};

ER_HD inline Alpha make_alpha(double a) {
    Alpha al;
    al.a = a;
    al.a1 = a - 1.0;
    al.shift = a > 2.0 ? 1.0 / al.a1 : 0.0;
    al.mode = a == 1.0 ? SOFTMAX : a == 2.0 ? SPARSEMAX : a == 1.5 ? ENTMAX15 : a > 2.0 ? GENERAL_GT2 : GENERAL;
    al.halley = a > 1.0 && a < 1.5;
    return al;
}

// Probability at offset d = y - s from the solver variable s (A, or v when alpha > 2),
// with u = p^(2-alpha) (-dp/ds) and w = (2-alpha) p^(3-2 alpha) (d2p/ds2; only used when
// al.halley).  Off the support p = u = w = 0.  The expressions follow numpy_backend.py.
struct Terms {
    double p, u, w;
};

ER_HD inline Terms terms(const Alpha& al, double d) {
    Terms r = {0.0, 0.0, 0.0};
    switch (al.mode) {
        case SOFTMAX: {
            double p = exp(d);
            r.p = p; r.u = p; r.w = p;
            break;
        }
        case SPARSEMAX: {
            double t = 1.0 + d;
            if (t > 0.0) { r.p = t; r.u = 1.0; }
            break;
        }
        case ENTMAX15: {
            double t = 1.0 + 0.5 * d;
            if (t > 0.0) { r.p = t * t; r.u = t; r.w = 0.5; }
            break;
        }
        case GENERAL: {  // 1 < alpha < 2, alpha != 1.5: exp(log1p((a-1) d) / (a-1))
            double t = al.a1 * d;
            if (t > -1.0) {
                double logp = log1p(t) / al.a1;
                r.p = exp(logp);
                if (r.p > 0.0) {
                    r.u = exp((2.0 - al.a) * logp);
                    r.w = (2.0 - al.a) * exp((3.0 - 2.0 * al.a) * logp);
                }
            }
            break;
        }
        default: {  // alpha > 2, d = y - v: p = ((a-1) d)^(1/(a-1))
            double t = al.a1 * d;
            if (t > 0.0) {
                double logp = log(t) / al.a1;
                r.p = exp(logp);
                if (r.p > 0.0) r.u = exp((2.0 - al.a) * logp);
            }
            break;
        }
    }
    return r;
}

// alpha > 2, edge-relative (numpy_backend._edge_p): with c the smallest support entry,
// d = y - c and q the edge probability, p = (a1 d + q^a1)^(1/a1) for d > 0, q at d = 0 and 0
// below c, and at least q for d > 0 (the log round trip can land an ulp below it).
// log p = logaddexp(log(a1 d), a1 log q) / a1, so q^a1 (below the float64 range
// once q < ~1e-308^(1/a1): 8e-4 at alpha = 100, 0.5 at alpha = 1000) is never formed.
// logaddexp is numpy's npy_logaddexp step for step.
ER_HD inline double logaddexp(double x, double y) {
    if (x == y) return x + 0.6931471805599453;  // also -inf, -inf
    double t = x - y;
    if (t > 0.0) return x + log1p(exp(-t));
    if (t <= 0.0) return y + log1p(exp(t));
    return t;  // nan
}

ER_HD inline double edge_lq(double q, double a1) { return q > 0.0 ? a1 * log(q) : -inf(); }  // log(q^a1)

// log p at offset d from c (-inf off the support); lq = edge_lq(q, a1).
ER_HD inline double edge_logp(double d, double a1, double q, double lq) {
    if (d < 0.0) return -inf();
    double at_edge = q > 0.0 ? log(q) : -inf();
    return d > 0.0 ? fmax(logaddexp(log(a1 * d), lq) / a1, at_edge) : at_edge;
}

ER_HD inline double edge_p(double d, double a1, double q, double lq) {
    if (d > 0.0) return fmax(exp(logaddexp(log(a1 * d), lq) / a1), q);  // >= q, as numpy's edge_p
    return d == 0.0 ? q : 0.0;
}

// ------------------------------------------------------------------------ row solver
struct Solve {
    double m;       // row max (-inf for an all -inf row)
    double base;    // p_i = P((x_i - m - base) - s); base = 0 except for alpha > 2, where
    double s;       //   base = c is the smallest support entry and s = q the edge probability:
                    //   p_i = edge_p((x_i - m) - c, alpha - 1, q) (see solve_row)
    double theta;   // x-space threshold m + ((base + s) + shift); alpha > 2: m + ((c - q^a1/a1) + shift)
    int n_iter;     // passes over the row that evaluated f
    bool converged;
};

// Evaluation of f(s) = sum_i P((y_i - base) - s) - 1 and what the steps need, in one pass.
struct Eval {
    double f, d1, d2;  // f, -f', f''
    double k;          // support size at s
    double s1, s2;     // closed-form sums over the support (sparsemax: sum y; 1.5: sum w, sum w^2)
};

template <class Team, class X>
ER_HD Eval evaluate(const Team& team, const X& x, int n, const Alpha& al, double m, double base, double s) {
    double out[6];
    team.template reduce_sum<6>(n, [&](int i, Acc<6>& acc) {
        double y = x(i) - m;
        Terms t = terms(al, (y - base) - s);
        if (t.p > 0.0) {
            acc.add(0, t.p);
            acc.add(1, t.u);
            if (al.halley) acc.add(2, t.w);
            acc.add(3, 1.0);
            if (al.mode == SPARSEMAX) {
                acc.add(4, y);
            } else if (al.mode == ENTMAX15) {
                double w = 1.0 + 0.5 * y;
                acc.add(4, w);
                acc.add(5, w * w);
            }
        }
    }, out);
    Eval e;
    e.f = out[0] - 1.0;
    e.d1 = out[1];
    e.d2 = out[2];
    e.k = out[3];
    e.s1 = out[4];
    e.s2 = out[5];
    return e;
}

// Root of f restricted to the current support (exact when that support is the true one).
ER_HD inline double closed_form(const Alpha& al, const Eval& e) {
    if (al.mode == SPARSEMAX) return (e.k + e.s1 - 1.0) / e.k;  // sum_S (1 + y_i - A) = 1
    // 1.5: sum_S (w_i - A/2)^2 = 1 with w = 1 + y/2; the left root of the quadratic.
    double mean = e.s1 / e.k;
    double ss = e.s2 - e.s1 * mean;  // sum_S (w_i - mean)^2
    double disc = (1.0 - ss) / e.k;
    return 2.0 * (mean - sqrt(disc > 0.0 ? disc : 0.0));
}

// A bracket [lo, hi] of the root of the decreasing f: f(lo) >= 0 > f(hi) once evaluated.
struct Bracket {
    double lo, hi, flo, fhi;
    bool has_lo, has_hi;
    ER_HD void note(double s, double f) {
        if (f >= 0.0) { lo = s; flo = f; has_lo = true; }
        else { hi = s; fhi = f; has_hi = true; }
    }
    ER_HD bool closed() const {  // no float64 strictly inside
        double mid = 0.5 * (lo + hi);
        return mid <= lo || mid >= hi;
    }
};

// Shrink [lo, hi] to two adjacent float64s around the root of f(s) = sum P((y - base) - s) - 1,
// then return the end whose |f| is smaller (numpy_backend._last_bit and _closest).
// METHOD_BISECT: plain bisection.  Otherwise: safeguarded Halley (alpha < 1.5) or Newton
// steps from lo, a bisection whenever a step leaves the bracket or does not halve the step
// before last; when a step no longer moves s, probes at 1, 2, 4, ... ulps on the far side
// of s find the other end and bisection closes the gap.  Returns false if max_iter passes
// ran out first.
// ev(s) returns the Eval of the (decreasing) f at s: f, d1 = -f' and, when halley, d2 = f''.
// The steps start from b.lo, or from b.hi when from_hi (f concave: Newton from the right
// then decreases monotonically to the root).
template <class F>
ER_HD bool last_bit_root_fn(F ev, bool halley, bool from_hi, Bracket& b, int method, int max_iter, int& n_iter,
                            double& s_out) {
    bool ok = true;
    if (method != METHOD_BISECT && !b.closed()) {
        double s = from_hi ? b.hi : b.lo;
        double dx_old = b.hi - b.lo, dx_older = b.hi - b.lo;
        while (true) {
            if (n_iter >= max_iter) { ok = false; break; }
            Eval e = ev(s);
            n_iter++;
            b.note(s, e.f);
            if (e.f == 0.0) {  // an exact root: nothing can beat |f| = 0
                s_out = s;
                return true;
            }
            if (b.closed()) break;
            double cand = s + e.f / e.d1;
            if (halley) {
                double den = 2.0 * e.d1 * e.d1 - e.f * e.d2;
                if (den > 0.0) cand = s + 2.0 * e.f * e.d1 / den;
            }
            if (cand == s) {  // converged to the last bits: find the other end next to s
                double dir = e.f >= 0.0 ? inf() : -inf();
                double gap = fabs(nextafter(s, dir) - s);
                while (n_iter < max_iter) {
                    double t = e.f >= 0.0 ? s + gap : s - gap;
                    if (!(t > b.lo && t < b.hi)) break;
                    Eval et = ev(t);
                    n_iter++;
                    b.note(t, et.f);
                    if ((et.f >= 0.0) != (e.f >= 0.0)) break;
                    gap *= 2.0;
                }
                break;
            }
            // A step that leaves the bracket or does not halve the step before last is
            // replaced by bisection (entries entering the support are kinks with infinite
            // slope for alpha > 2, where Newton alone stalls).
            if (!(cand > b.lo && cand < b.hi) || fabs(cand - s) > 0.5 * fabs(dx_older)) cand = 0.5 * (b.lo + b.hi);
            dx_older = dx_old;
            dx_old = cand - s;
            s = cand;
        }
    }
    // Bisection to adjacent float64s (the whole solve for METHOD_BISECT).
    while (ok && !b.closed()) {
        if (n_iter >= max_iter) { ok = false; break; }
        double mid = 0.5 * (b.lo + b.hi);
        b.note(mid, ev(mid).f);
        n_iter++;
    }
    if (!b.has_lo) { b.flo = ev(b.lo).f; b.has_lo = true; }
    if (!b.has_hi) { b.fhi = ev(b.hi).f; b.has_hi = true; }
    s_out = fabs(b.fhi) < fabs(b.flo) ? b.hi : b.lo;
    return ok;
}

template <class Team, class X>
ER_HD bool last_bit_root(const Team& team, const X& x, int n, const Alpha& al, double m, double base,
                         Bracket& b, int method, int max_iter, int& n_iter, double& s_out) {
    return last_bit_root_fn([&](double s) { return evaluate(team, x, n, al, m, base, s); }, al.halley, false, b,
                            method, max_iter, n_iter, s_out);
}

// Solve one row.
//   alpha = 1 (default method): theta = m + log(sum exp(y)), no iteration.
//   alpha in {1.5, 2} (default): Newton from A = 0 (a lower bound; f is convex, so the
//     iterates stay below the root and the support only shrinks) and, at every point with
//     f > 0, the closed-form root on its support; when that root keeps the support size it
//     is exact (finite termination), and one Newton step from it removes its rounding.
//   any other alpha, or method METHOD_BISECT: last_bit_root on A over
//     [0, (1 - n^(1-alpha))/(alpha-1)] ([0, log n] at 1) for alpha <= 2.  For alpha > 2 the
//     variable is the support threshold T = A - 1/(alpha-1) over
//     [-1/(alpha-1), -n^(1-alpha)/(alpha-1)]; then, with c the smallest support entry
//     (y > lo) and d_i = y_i - c, a second last_bit_root on the edge probability q over
//     [0, q(lo)], q(lo) = (a1 (c - lo)(1 + 4 eps))^(1/a1): p_i = edge_p(d_i, a1, q), computed
//     in log space (p = q exactly at the edge), so every p_i is exact to the last bits even
//     where T cannot resolve it and where q^a1 = a1 (c - T) is below the float64 range
//     (numpy_backend._bisect does the same).  The support is fixed in this stage, and the
//     mass is smooth, increasing and convex in q with slope >= 1 (dp_i/dq = (q/p_i)^(a1-1),
//     1 at the edge), so Newton from the right end q(lo) decreases monotonically to the root
//     (numba's _edge_q does the same); the safeguards of last_bit_root_fn apply.
template <class Team, class X>
ER_HD Solve solve_row(const Team& team, const X& x, int n, double alpha, int method, int max_iter) {
    Solve r;
    Alpha al = make_alpha(alpha);
    r.m = team.reduce_max(n, [&](int i) { return x(i); });
    r.base = 0.0;
    r.s = 0.0;
    r.n_iter = 0;
    r.converged = true;
    if (!(r.m > -inf())) {  // all -inf (or n = 0)
        r.theta = -inf();
        return r;
    }
    const double m = r.m;
    if (method != METHOD_BISECT && al.mode == SOFTMAX) {
        double out[1];
        team.template reduce_sum<1>(n, [&](int i, Acc<1>& acc) { acc.add(0, exp(x(i) - m)); }, out);
        r.s = log(out[0]);
        r.theta = m + r.s;
        return r;
    }
    if (method != METHOD_BISECT && (al.mode == SPARSEMAX || al.mode == ENTMAX15)) {
        double s = 0.0, lo = 0.0, hi = inf();
        double closed_k = -1.0;  // support size the current point was computed from
        bool done = false;
        while (r.n_iter < max_iter) {
            Eval e = evaluate(team, x, n, al, m, 0.0, s);
            r.n_iter++;
            if (closed_k >= 0.0 && e.k == closed_k) {
                double t = s + e.f / e.d1;
                if (t >= lo && t <= hi) s = t;
                done = true;
                break;
            }
            if (e.f == 0.0) { done = true; break; }
            if (e.f > 0.0) lo = s; else hi = s;
            double cand;
            closed_k = -1.0;
            if (e.f > 0.0) {
                cand = closed_form(al, e);
                closed_k = e.k;
            } else {
                cand = s + e.f / e.d1;  // Newton from the right: below the root (convexity)
            }
            if (cand == s) { done = true; break; }
            if (!(cand > lo && cand < hi)) {
                if (!(hi < inf())) { done = true; break; }  // cannot happen in exact arithmetic
                closed_k = -1.0;
                cand = 0.5 * (lo + hi);
                if (cand <= lo || cand >= hi) { done = true; break; }
            }
            s = cand;
        }
        r.converged = done;
        r.s = s;
        r.theta = m + r.s;
        return r;
    }
    // Count of finite entries: the uniform end of the bracket.
    double nf;
    {
        double out[1];
        team.template reduce_sum<1>(n, [&](int i, Acc<1>& acc) {
            if (x(i) > -inf()) acc.add(0, 1.0);
        }, out);
        nf = out[0];
    }
    const double a1 = al.a1;
    Bracket b;
    b.has_lo = b.has_hi = false;
    b.flo = b.fhi = 0.0;
    if (al.mode == SOFTMAX) {
        b.lo = 0.0;
        b.hi = log(nf);
    } else if (al.mode == GENERAL_GT2) {
        b.lo = -1.0 / a1;
        b.hi = -exp(-a1 * log(nf)) / a1;
    } else {
        b.lo = 0.0;
        b.hi = -expm1(-a1 * log(nf)) / a1;
    }
    double s;
    bool ok = last_bit_root(team, x, n, al, m, 0.0, b, method, max_iter, r.n_iter, s);
    if (al.mode == GENERAL_GT2) {
        const double lo = b.lo;
        double c = -team.reduce_max(n, [&](int i) {
            double y = x(i) - m;
            return y > lo ? -y : -inf();
        });
        Bracket b2;
        b2.has_lo = b2.has_hi = false;
        b2.flo = b2.fhi = 0.0;
        b2.lo = 0.0;
        b2.hi = exp(log((a1 * (c - lo)) * (1.0 + ER_EDGE_ULPS * 2.220446049250313e-16)) / a1);
        // f(q) = 1 - sum_i p_i(q) (decreasing), d1 = sum_i dp_i/dq.
        auto evq = [&](double q) {
            const double lq = edge_lq(q, a1);
            const double lqq = q > 0.0 ? log(q) : -inf();
            double out[2];
            team.template reduce_sum<2>(n, [&](int i, Acc<2>& acc) {
                double d = (x(i) - m) - c;
                if (d > 0.0) {
                    double lp = logaddexp(log(a1 * d), lq) / a1;
                    acc.add(0, exp(lp));
                    if (q > 0.0) acc.add(1, exp((a1 - 1.0) * (lqq - lp)));
                } else if (d == 0.0) {
                    acc.add(0, q);
                    acc.add(1, 1.0);
                }
            }, out);
            Eval e;
            e.f = 1.0 - out[0];
            e.d1 = out[1];
            e.d2 = 0.0;
            e.k = e.s1 = e.s2 = 0.0;
            return e;
        };
        double q;
        ok = last_bit_root_fn(evq, false, true, b2, method, max_iter, r.n_iter, q) && ok;
        double delta = q > 0.0 ? exp(a1 * log(q)) / a1 : 0.0;  // may underflow: theta does not need it
        r.converged = ok;
        r.base = c;
        r.s = q;
        r.theta = m + ((c - delta) + al.shift);
        return r;
    }
    r.converged = ok;
    r.s = s;
    r.theta = m + ((r.base + r.s) + al.shift);
    return r;
}

// Write p_i = P((x_i - m - base) - s) (zeros when theta = -inf); return the support size.
template <class Team, class X, class T>
ER_HD long long write_probs(const Team& team, const X& x, int n, double alpha, const Solve& r, T* p) {
    Alpha al = make_alpha(alpha);
    if (!(r.m > -inf())) {
        team.for_each(n, [&](int i) { p[i] = T(0); });
        return 0;
    }
    const double lq = al.mode == GENERAL_GT2 ? edge_lq(r.s, al.a1) : 0.0;
    double out[1];
    team.template reduce_sum<1>(n, [&](int i, Acc<1>& acc) {
        double pi = al.mode == GENERAL_GT2 ? edge_p((x(i) - r.m) - r.base, al.a1, r.s, lq)
                                           : terms(al, ((x(i) - r.m) - r.base) - r.s).p;
        p[i] = store<T>(pi);
        if (pi > 0.0) acc.add(0, 1.0);  // counted in float64, as the reference does
    }, out);
    return (long long)out[0];
}

// Attention forward: p (may alias the scores x read, index by index) and the skew weights
// u = p^(2-alpha) (alpha > 2: u / max u); returns the support size and sum_j u_j (0 for
// empty rows).
template <class Team, class X, class T>
ER_HD long long write_probs_weights(const Team& team, const X& x, int n, double alpha, const Solve& r, T* p, T* u,
                                    double& sum_u) {
    Alpha al = make_alpha(alpha);
    if (!(r.m > -inf())) {
        team.for_each(n, [&](int i) { p[i] = T(0); u[i] = T(0); });
        sum_u = 0.0;
        return 0;
    }
    const double lq = al.mode == GENERAL_GT2 ? edge_lq(r.s, al.a1) : 0.0;
    // alpha > 2: u = p^(2-alpha) overflows at the support's edge; the weights are written
    // as u / max u (log space), which leaves the skewed output sum u v / sum u unchanged.
    const double lmax = al.mode == GENERAL_GT2 ? team.reduce_max(n, [&](int i) {
        double lp = edge_logp((x(i) - r.m) - r.base, al.a1, r.s, lq);
        return exp(lp) > 0.0 ? (2.0 - al.a) * lp : -inf();
    }) : 0.0;
    double out[2];
    team.template reduce_sum<2>(n, [&](int i, Acc<2>& acc) {
        Terms t;
        if (al.mode == GENERAL_GT2) {  // edge-relative (see solve_row); u / max u in log space
            double lp = edge_logp((x(i) - r.m) - r.base, al.a1, r.s, lq);
            t.p = exp(lp);
            t.u = t.p > 0.0 ? exp((2.0 - al.a) * lp - lmax) : 0.0;
            t.w = 0.0;
        } else {
            t = terms(al, ((x(i) - r.m) - r.base) - r.s);
        }
        p[i] = store<T>(t.p);
        u[i] = store<T>(t.u);
        if (t.p > 0.0) {
            acc.add(0, 1.0);
            acc.add(1, t.u);
        }
    }, out);
    sum_u = out[1];
    return (long long)out[0];
}

// ------------------------------------------------------------------------ VJPs
// u = p^(2-alpha) on the support (exp((2-alpha) log p), as numpy_backend.skew_weights).
ER_HD inline double skew_weight(double p, double alpha) {
    return p > 0.0 ? exp((2.0 - alpha) * log(p)) : 0.0;
}

// sign(v) exp(l + log|v|) (0 at v = 0): exp(l) * v without overflowing early.
ER_HD inline double signed_exp(double l, double v) {
    if (v == 0.0) return 0.0;
    double e = exp(l + log(fabs(v)));
    return v > 0.0 ? e : -e;
}

// log u = (2 - alpha) log p on the support, -inf elsewhere.
ER_HD inline double log_skew(double p, double a2) { return p > 0.0 ? a2 * log(p) : -inf(); }

// alpha > 2: out = {S, G}, S = sum w and G = sum w g with w = u / max u = exp(lu - lmax)
// (lmax the largest lu), over the support; the ratio G / S is r = (u . g) / sum u.
template <class Team, class P, class G>
ER_HD void scaled_weight_sums(const Team& team, const P* p, const G* g, int n, double a2, double lmax,
                              double out[2]) {
    team.template reduce_sum<2>(n, [&](int i, Acc<2>& acc) {
        double lu = log_skew(load(p[i]), a2);
        if (lu > -inf()) {
            double wi = exp(lu - lmax);
            acc.add(0, wi);
            acc.add(1, wi * load(g[i]));
        }
    }, out);
}

// alpha > 2 (numpy_backend._vjp_big): u is unbounded at the support's edge and overflows
// (u = 1e323 for p = 5e-4 at alpha = 100).  With lu = (2-alpha) log p, m the first entry of
// largest u, w = exp(lu - lu_m) = u / max u, S = sum w, G = sum w g:
//   g_i - r = (g_i (S - w_i) - (G - w_i g_i)) / S   (i != m; S - w_i >= S/2, no cancellation)
//   dx_i = u_i (g_i - r), as sign exp(lu_i + log|g_i - r|) where u_i overflows, 0 where g_i = r
//   dx_m = sum_{j != m} u_j (g_m - g_j) / S, else (not finite) the same sum scaled by the
//          second largest u, exp(l2) sum_{j != m} exp(lu_j - l2) (g_m - g_j) / S.
template <class Team, class P, class G, class D>
ER_HD void vjp_row_big(const Team& team, const P* p, const G* g, int n, double alpha, D* dx) {
    const double a2 = 2.0 - alpha;
    const double lmax = team.reduce_max(n, [&](int i) { return log_skew(load(p[i]), a2); });
    if (!(lmax > -inf())) {  // empty row
        team.for_each(n, [&](int i) { dx[i] = D(0); });
        return;
    }
    const int mi = (int)-team.reduce_max(n, [&](int i) {  // the first entry of largest u
        return log_skew(load(p[i]), a2) == lmax ? -double(i) : -inf();
    });
    const double gm = load(g[mi]);
    const double l2 = team.reduce_max(n, [&](int i) { return i == mi ? -inf() : log_skew(load(p[i]), a2); });
    double out[2];
    scaled_weight_sums(team, p, g, n, a2, lmax, out);
    const double S = out[0], Gs = out[1];
    double dm = 0.0;
    if (l2 > -inf()) {  // m is not alone on the support
        double sd[1];
        team.template reduce_sum<1>(n, [&](int i, Acc<1>& acc) {
            double lu = log_skew(load(p[i]), a2);
            if (lu > -inf() && i != mi) acc.add(0, exp(lu) * (gm - load(g[i])));
        }, sd);
        dm = sd[0] / S;
        if (!is_finite(dm)) {
            double t[1];
            team.template reduce_sum<1>(n, [&](int i, Acc<1>& acc) {
                double lu = log_skew(load(p[i]), a2);
                if (lu > -inf() && i != mi) acc.add(0, exp(lu - l2) * (gm - load(g[i])));
            }, t);
            dm = signed_exp(l2, t[0] / S);
        }
    }
    team.for_each(n, [&](int i) {
        double lu = log_skew(load(p[i]), a2);
        double v = 0.0;
        if (i == mi) {
            v = dm;
        } else if (lu > -inf()) {
            double gi = load(g[i]);
            double wi = exp(lu - lmax);
            double diff = (gi * (S - wi) - (Gs - wi * gi)) / S;
            if (diff != 0.0) {
                double u = exp(lu);
                v = is_finite(u) ? u * diff : signed_exp(lu, diff);
            }
        }
        dx[i] = store<D>(v);
    });
}

// dx_i = u_i (g_i - sum_j u_j g_j / sum_j u_j); alpha > 2 by vjp_row_big.
template <class Team, class P, class G, class D>
ER_HD void vjp_row(const Team& team, const P* p, const G* g, int n, double alpha, D* dx) {
    if (alpha > 2.0) {
        vjp_row_big(team, p, g, n, alpha, dx);
        return;
    }
    double out[2];
    team.template reduce_sum<2>(n, [&](int i, Acc<2>& acc) {
        double u = skew_weight(load(p[i]), alpha);
        acc.add(0, u);
        acc.add(1, u * load(g[i]));
    }, out);
    double r = out[0] > 0.0 ? out[1] / out[0] : 0.0;
    team.for_each(n, [&](int i) {
        double u = skew_weight(load(p[i]), alpha);
        dx[i] = store<D>(u * (load(g[i]) - r));
    });
}

// h(w) = (e^w - 1 - w) / w^2 without cancellation (1/2 at w = 0); numpy_backend._h.
ER_HD inline double h_series(double w) {
    if (fabs(w) < 1.0) {
        double series = 0.0, term = 0.5;
        for (int k = 0; k < ER_SERIES_TERMS; ++k) {
            series += term;
            term = term * w / (k + 3);
        }
        return series;
    }
    return (expm1(w) - w) / (w * w);
}

// sum_i g_i dp_i/dalpha with dp_i/dalpha = p_i c_i - u_i sum_j p_j c_j / sum_j u_j and
// p_i c_i = -p_i log(p_i)^2 h(-(alpha-1) log p_i) (numpy_backend.entmax_alpha_vjp).
// alpha > 2: the same value in the always-finite form
// sum_i p_i (1 - (alpha-1) log p_i) (g_i - r) / (alpha-1)^2 with r = (w . g) / sum w,
// w = u / max u (the unbounded u-terms of p_i c_i cancel exactly and are left out).
template <class Team, class P, class G>
ER_HD double alpha_vjp_row(const Team& team, const P* p, const G* g, int n, double alpha) {
    if (alpha > 2.0) {
        const double a1 = alpha - 1.0, a2 = 2.0 - alpha;
        const double lmax = team.reduce_max(n, [&](int i) { return log_skew(load(p[i]), a2); });
        if (!(lmax > -inf())) return 0.0;
        double sw[2];
        scaled_weight_sums(team, p, g, n, a2, lmax, sw);
        const double r = sw[1] / sw[0];
        double t[1];
        team.template reduce_sum<1>(n, [&](int i, Acc<1>& acc) {
            double pi = load(p[i]);
            if (pi > 0.0) acc.add(0, pi * (1.0 - a1 * log(pi)) * (load(g[i]) - r));
        }, t);
        return t[0] / (a1 * a1);
    }
    double out[4];
    team.template reduce_sum<4>(n, [&](int i, Acc<4>& acc) {
        double pi = load(p[i]);
        if (pi > 0.0) {
            double L = log(pi);
            double pc = -pi * L * L * h_series(-(alpha - 1.0) * L);
            double u = exp((2.0 - alpha) * L);
            double gi = load(g[i]);
            acc.add(0, gi * pc);
            acc.add(1, pc);
            acc.add(2, u);
            acc.add(3, u * gi);
        }
    }, out);
    double corr = out[2] > 0.0 ? out[3] * out[1] / out[2] : 0.0;
    return out[0] - corr;
}

// ------------------------------------------------------------------------ attention rows
// One score row of a query chunk, as numpy_attention._Block builds it: a_j = scale * dot_j,
// z_j = s * a_j - slope * |i_abs - j|, -inf for keys the row may not see (j >= length, or
// j > i_abs when causal).  dot is the row of raw q.k products (cuBLAS).
template <class T>
struct ScoreRow {
    const T* dot;
    double scale, s, slope;
    long long i_abs;
    int limit;  // keys j < limit are visible
    bool has_s;
    ER_HD double a(int j) const { return scale * load(dot[j]); }
    ER_HD double operator()(int j) const {
        if (j >= limit) return -inf();
        double z = a(j);
        if (has_s) z = z * s;
        if (slope != 0.0) {
            long long d = i_abs - j;
            z = z - slope * double(d < 0 ? -d : d);
        }
        return z;
    }
};

template <class T>
ER_HD inline ScoreRow<T> score_row(const T* dot, int n_keys, double scale, const double* row_scale, const double* slopes,
                                   const long long* key_lengths, bool causal, int b, int h, long long i, long long offset) {
    ScoreRow<T> r;
    r.dot = dot;
    r.scale = scale;
    r.has_s = row_scale != nullptr;
    r.s = r.has_s ? row_scale[0] : 1.0;
    r.slope = slopes != nullptr ? slopes[h] : 0.0;
    r.i_abs = i + offset;
    long long lim = key_lengths != nullptr ? key_lengths[b] : n_keys;
    if (lim > n_keys) lim = n_keys;
    if (causal && r.i_abs + 1 < lim) lim = r.i_abs + 1;
    r.limit = lim < 0 ? 0 : (int)lim;
    return r;
}

// p and u = p^(2-alpha) from the x-space threshold (backward; numpy's e_alpha(z - theta)).
ER_HD inline Terms terms_from_theta(const Alpha& al, double z, double theta) {
    if (!(theta > -inf()) || !(z > -inf())) {
        Terms t = {0.0, 0.0, 0.0};
        return t;
    }
    return terms(al, (z - theta) + al.shift);
}

// ------------------------------------------------------------------------ attention residual
// The backward's residual of a score row (numpy_attention.edge_residual): the row maximum
// m, the edge c = min over the support of (x_i - m) and its probability q.  For alpha > 2
// the row solver writes p = q exactly where x_i - m = c, so (m, c, q) rebuild every p of the
// row bit for bit (edge_p); theta cannot (the edge entry's gap to it is below its ulp).
struct EdgeResidual {
    double m, c, q;
};

template <class Team, class X>
ER_HD EdgeResidual edge_residual(const Team& team, const X& x, int n, double alpha, const Solve& r) {
    EdgeResidual e = {-inf(), -inf(), 0.0};
    if (!(r.m > -inf())) return e;
    Alpha al = make_alpha(alpha);
    const double lq = al.mode == GENERAL_GT2 ? edge_lq(r.s, al.a1) : 0.0;
    auto prob = [&](int i) {
        return al.mode == GENERAL_GT2 ? edge_p((x(i) - r.m) - r.base, al.a1, r.s, lq)
                                      : terms(al, ((x(i) - r.m) - r.base) - r.s).p;
    };
    const double negc = team.reduce_max(n, [&](int i) { return prob(i) > 0.0 ? -(x(i) - r.m) : -inf(); });
    if (!(negc > -inf())) return e;
    e.m = r.m;
    e.c = -negc;
    e.q = team.reduce_max(n, [&](int i) { return (x(i) - r.m) == e.c ? prob(i) : -inf(); });
    return e;
}

// The offset d = (z - m) - c of a score z rebuilt by the backward from the edge residual,
// 0 within ER_EDGE_TIE_ULPS ulps of |z| + |m| (numpy_attention._rebuild_edge): the backward
// scores the keys again, with products that may round a score an ulp or two differently
// from the forward's, and the edge entry must stay the edge (p = q).
ER_HD inline double edge_offset(double z, const EdgeResidual& e) {
    const double d = (z - e.m) - e.c;
    return is_finite(d) && fabs(d) <= ER_EDGE_TIE_ULPS * 2.220446049250313e-16 * (fabs(z) + fabs(e.m)) ? 0.0 : d;
}

// p of a score value z from the residual (numpy_attention.rebuild_p): e_alpha(z - theta) for
// alpha <= 2, edge-relative for alpha > 2; 0 for an empty row (theta = -inf).
ER_HD inline double prob_from_residual(const Alpha& al, double z, double theta, const EdgeResidual& e) {
    if (!(theta > -inf()) || !(z > -inf())) return 0.0;
    if (al.mode == GENERAL_GT2) return edge_p(edge_offset(z, e), al.a1, e.q, edge_lq(e.q, al.a1));
    return terms(al, (z - theta) + al.shift).p;
}

// Attention backward of one score row from its residual, over the row's raw dot products
// and dp_j = dO . v_j (cupy_backend.py forms both with cuBLAS): writes p over p_out and
// s * dZ over dp, returns ds = sum_j dZ_j a_j (as sum_j dZ_j (a_j - a_m), m the first entry
// of largest u: the dZ sum to 0 and, for alpha > 2, are huge at the edge, where the a_j
// nearly agree).  dZ_j = u_j (dp_j - delta) with delta = dO . skew; for alpha > 2 as
// vjp_row_big forms it: u from log space (sign exp(log u + log|dp - delta|) where u
// overflows) and, at m, sum_{j != m} u_j (dp_m - dp_j) / S with S = sum_j u_j / u_m
// (scaled by the second largest u where that is not finite).  z(j) is the score, a(j) the
// unscaled content score, s the row scale.
template <class Team, class Z, class A, class T>
ER_HD double attn_grad_row(const Team& team, const Z& z, const A& a, int n, double alpha, double theta,
                           const EdgeResidual& e, double delta, double s, bool has_s, T* p_out, T* dp) {
    Alpha al = make_alpha(alpha);
    const double a2 = 2.0 - alpha;
    if (!(theta > -inf())) {
        team.for_each(n, [&](int j) { p_out[j] = T(0); dp[j] = T(0); });
        return 0.0;
    }
    auto lu_of = [&](int j) {  // log u on the support, -inf off it
        double pj = prob_from_residual(al, z(j), theta, e);
        return pj > 0.0 ? a2 * log(pj) : -inf();
    };
    const double lmax = team.reduce_max(n, lu_of);
    if (!(lmax > -inf())) {
        team.for_each(n, [&](int j) { p_out[j] = T(0); dp[j] = T(0); });
        return 0.0;
    }
    const int mi = (int)-team.reduce_max(n, [&](int j) { return lu_of(j) == lmax ? -double(j) : -inf(); });
    const double a_ref = team.reduce_max(n, [&](int j) { return j == mi ? a(j) : -inf(); });
    const double gm = team.reduce_max(n, [&](int j) { return j == mi ? load(dp[j]) : -inf(); });
    double dm = 0.0;
    if (al.mode == GENERAL_GT2) {
        const double l2 = team.reduce_max(n, [&](int j) { return j == mi ? -inf() : lu_of(j); });
        double sw[2];
        team.template reduce_sum<2>(n, [&](int j, Acc<2>& acc) {
            double lu = lu_of(j);
            if (lu > -inf()) {
                acc.add(0, exp(lu - lmax));
                if (j != mi) acc.add(1, exp(lu) * (gm - load(dp[j])));
            }
        }, sw);
        const double S = sw[0];
        if (l2 > -inf()) {
            dm = sw[1] / S;
            if (!is_finite(dm)) {
                double t[1];
                team.template reduce_sum<1>(n, [&](int j, Acc<1>& acc) {
                    double lu = lu_of(j);
                    if (lu > -inf() && j != mi) acc.add(0, exp(lu - l2) * (gm - load(dp[j])));
                }, t);
                dm = signed_exp(l2, t[0] / S);
            }
        }
    }
    double out[1];
    team.template reduce_sum<1>(n, [&](int j, Acc<1>& acc) {
        double lu = lu_of(j);
        double pj = lu > -inf() ? prob_from_residual(al, z(j), theta, e) : 0.0;
        double dz = 0.0;
        if (lu > -inf()) {
            if (al.mode == GENERAL_GT2 && j == mi) {
                dz = dm;
            } else {
                double diff = load(dp[j]) - delta;
                double u = al.mode == GENERAL_GT2 ? exp(lu) : terms_from_theta(al, z(j), theta).u;
                dz = diff == 0.0 ? 0.0 : (is_finite(u) ? u * diff : signed_exp(lu, diff));
            }
        }
        // a term with a = a_ref is 0, also where dz overflowed (not inf * 0 = NaN), as
        // numpy_attention._row_scale_grad and the numba backward have it
        if (a(j) != a_ref) acc.add(0, dz * (a(j) - a_ref));
        p_out[j] = store<T>(pj);
        dp[j] = store<T>(has_s ? dz * s : dz);
    }, out);
    return out[0];
}

// ------------------------------------------------------------------------ row readers
template <class T>
struct RowReader {
    const T* x;
    ER_HD double operator()(int i) const { return load(x[i]); }
};

}  // namespace er
