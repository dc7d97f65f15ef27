/* check_entmax.c: check a short C alpha-entmax against entmax.jsonl of an entmax-ref corpus.
 *
 *     cc -std=c99 -O2 -o check_entmax check_entmax.c -lm && ./check_entmax CORPUS_DIR
 *
 * Prints one line per case (PASS, FAIL or SKIP, its tcId, alpha and dtype) and a summary; exits
 * 1 when a case fails, 2 when the corpus cannot be read.  Replace entmax() by your own.
 */
#include "entmax_corpus.h"

/* ---------------------------------------------------------------- the implementation under test
 * alpha-entmax of x[0..n) into p: softmax at alpha = 1, sparsemax by sorting at alpha = 2, else
 * bisection on tau in p_i = [(alpha - 1)(x_i - max x) - tau]_+^(1/(alpha - 1)), sum p = 1.
 * Returns 0, or -1 outside its domain: 1 < alpha < 1.01 loses precision in the power, and above
 * alpha = 2 a plain bisection loses the entries near the support's edge (p_i = t^(1/(alpha-1))
 * moves by far more than t's rounding error: the corpus's alpha-above-2 cases fail it). */
static int desc(const void *a, const void *b) {
    double u = *(const double *)a, v = *(const double *)b;
    return (u < v) - (u > v);
}

static int entmax(const double *x, size_t n, double alpha, double *p, double *work) {
    double m = -INFINITY, sum = 0.0, cum = 0.0, tau = 0.0, lo, hi, a1 = alpha - 1.0;
    size_t i, k, it;
    if ((alpha != 1.0 && a1 < 0.01) || alpha > 2.0) return -1;
    for (i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    for (i = 0; i < n; i++) work[i] = x[i] - m;          /* exact for -inf too: -inf */
    if (m == -INFINITY) { for (i = 0; i < n; i++) p[i] = 0.0; return 0; }  /* all masked */
    if (alpha == 1.0) {
        for (i = 0; i < n; i++) sum += (p[i] = exp(work[i]));
    } else if (alpha == 2.0) {
        qsort(work, n, sizeof *work, desc);
        for (k = 0; k < n; k++) {                        /* support: 1 + (k+1) z_k > z_0 + ... + z_k */
            cum += work[k];
            if (1.0 + (k + 1) * work[k] > cum) tau = (cum - 1.0) / (k + 1);
        }
        for (i = 0; i < n; i++) sum += (p[i] = x[i] - m > tau ? x[i] - m - tau : 0.0);
    } else {
        lo = -1.0; hi = -pow(1.0 / n, a1);               /* f(lo) >= 0 >= f(hi) */
        for (it = 0; it < 2000; it++) {
            double mid = 0.5 * (lo + hi), f = -1.0;
            if (mid <= lo || mid >= hi) break;
            for (i = 0; i < n; i++) f += a1 * work[i] > mid ? pow(a1 * work[i] - mid, 1.0 / a1) : 0.0;
            if (f >= 0.0) lo = mid; else hi = mid;
        }
        for (i = 0; i < n; i++) sum += (p[i] = a1 * work[i] > lo ? pow(a1 * work[i] - lo, 1.0 / a1) : 0.0);
    }
    for (i = 0; i < n; i++) p[i] /= sum;
    return 0;
}

/* ---------------------------------------------------------------- the corpus loop */
static int check_case(const ec_value *c, int *skipped) {
    size_t n = ec_count(ec_get(c, "x_hex")), i;
    double alpha = ec_entry(c, "alpha", 0);
    double *x = (double *)malloc(4 * n * sizeof *x + 1), *p = x + n, *expected = p + n, *work = expected + n;
    int ok = 1;
    if (!x) return 0;
    ec_numbers(ec_get(c, "x_hex"), x);  /* exact values of the case's dtype */
    ec_numbers(ec_get(c, "p_hex"), expected);
    if (entmax(x, n, alpha, p, work) != 0) { *skipped = 1; free(x); return 1; }
    for (i = 0; i < n && ok; i++) {
        if (!ec_within(c, "p", i, p[i], expected[i])) {
            ok = 0;
            printf("FAIL %s: p[%lu] = %.17g, expected %.17g (%s)\n", ec_str(c, "tcId"), (unsigned long)i, p[i],
                   expected[i], ec_str(c, "why"));
        }
    }
    free(x);
    return ok;
}

int main(int argc, char **argv) {
    char path[4096], err[200], *line;
    unsigned long passed = 0, failed = 0, skipped = 0;
    FILE *f;
    if (argc != 2) { fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]); return 2; }
    snprintf(path, sizeof path, "%s/entmax.jsonl", argv[1]);
    if (!(f = fopen(path, "r"))) { fprintf(stderr, "cannot open %s\n", path); return 2; }
    while ((line = ec_read_line(f)) != NULL) {
        ec_value c;
        const ec_value *fmt;
        int skip = 0, ok;
        if (ec_parse(line, &c, err, sizeof err) != 0) { fprintf(stderr, "%s: %s\n", path, err); return 2; }
        free(line);
        fmt = ec_get(ec_get(&c, "schema"), "format");
        if (!fmt || fmt->type != EC_NUMBER || fmt->number != EC_FORMAT_MAJOR) {
            fprintf(stderr, "%s: not a format %d corpus\n", path, EC_FORMAT_MAJOR);
            return 2;
        }
        ok = check_case(&c, &skip);
        if (skip) { skipped++; printf("SKIP %s alpha=%s %s\n", ec_str(&c, "tcId"), ec_str(&c, "alpha"), ec_str(&c, "dtype")); }
        else if (ok) { passed++; printf("PASS %s alpha=%s %s\n", ec_str(&c, "tcId"), ec_str(&c, "alpha"), ec_str(&c, "dtype")); }
        else failed++;
        ec_free(&c);
    }
    fclose(f);
    printf("%lu passed, %lu failed, %lu skipped\n", passed, failed, skipped);
    return failed || !passed ? 1 : 0;
}
