/* check_entmax.c: check a short C alpha-entmax and its gradient against entmax.jsonl and
 * entmax_vjp.jsonl of an entmax-ref corpus (format 2).
 *
 *     cc -std=c99 -O2 -o check_entmax check_entmax.c -lm && ./check_entmax CORPUS_DIR
 *
 * Every field a file's tolerance classes name is checked: p, tau and support of entmax.jsonl,
 * dx of entmax_vjp.jsonl.  Prints one line per failing case (its tcId, the field and index, the
 * value got and expected in hex, the bound and its class), then counts per file, field and
 * class, and a total; exits 1 when a case fails, 2 when the corpus cannot be read.  Replace
 * entmax() and entmax_vjp() by your own.
 */
#include "entmax_corpus.h"

/* 1 when the implementation below returns correctly rounded float64 values (the float64 cases
 * whose class is "exact" are then compared); this one is not, so it skips those fields. */
#define EXACT_FLOAT64 0

/* ---------------------------------------------------------------- the implementation under test
 * alpha-entmax of x[0..n) into p, its threshold tau (p_i = [(alpha-1) x_i - tau]_+^(1/(alpha-1)),
 * tau = logsumexp(x) at alpha = 1) and its support size: softmax at alpha = 1, sparsemax by
 * sorting at alpha = 2, else bisection on the threshold t of x - max x.  Returns 0, 1 outside its
 * domain (1 < alpha < 1.01 loses precision in the power, and above alpha = 2 a plain bisection
 * loses the entries near the support's edge), 2 for NaN or +inf scores (an error). */
static int desc(const void *a, const void *b) {
    double u = *(const double *)a, v = *(const double *)b;
    return (u < v) - (u > v);
}

static int entmax(const double *x, size_t n, double alpha, double *p, double *tau, long *support, double *work) {
    double m = -INFINITY, sum = 0.0, cum = 0.0, t = 0.0, lo, hi, a1 = alpha - 1.0;
    size_t i, k, it;
    for (i = 0; i < n; i++) {
        if (isnan(x[i]) || x[i] == INFINITY) return 2;
        m = x[i] > m ? x[i] : m;
    }
    if ((alpha != 1.0 && a1 < 0.01) || alpha > 2.0) return 1;
    *support = 0;
    if (m == -INFINITY) { for (i = 0; i < n; i++) p[i] = 0.0; *tau = -INFINITY; return 0; }  /* all masked */
    for (i = 0; i < n; i++) work[i] = x[i] - m;          /* exact for -inf too: -inf */
    if (alpha == 1.0) {
        for (i = 0; i < n; i++) sum += (p[i] = exp(work[i]));
        t = log(sum);
    } else if (alpha == 2.0) {
        qsort(work, n, sizeof *work, desc);
        for (k = 0; k < n; k++) {                        /* support: 1 + (k+1) z_k > z_0 + ... + z_k */
            cum += work[k];
            if (1.0 + (k + 1) * work[k] > cum) t = (cum - 1.0) / (k + 1);
        }
        for (i = 0; i < n; i++) sum += (p[i] = x[i] - m > t ? x[i] - m - t : 0.0);
    } else {
        lo = -1.0; hi = -pow(1.0 / n, a1);               /* f(lo) >= 0 >= f(hi) */
        for (it = 0; it < 2000; it++) {
            double mid = 0.5 * (lo + hi), f = -1.0;
            if (mid <= lo || mid >= hi) break;
            for (i = 0; i < n; i++) f += a1 * work[i] > mid ? pow(a1 * work[i] - mid, 1.0 / a1) : 0.0;
            if (f >= 0.0) lo = mid; else hi = mid;
        }
        t = lo;
        for (i = 0; i < n; i++) sum += (p[i] = a1 * work[i] > t ? pow(a1 * work[i] - t, 1.0 / a1) : 0.0);
    }
    for (i = 0; i < n; i++) p[i] /= sum;
    *tau = alpha == 1.0 ? m + t : a1 * m + t;            /* back from x - max x to x */
    for (i = 0; i < n; i++) *support += p[i] > 0.0;
    return 0;
}

/* dx = J^T g at p: u = p^(2 - alpha) on the support, dx = u (g - <u, g> / sum u). */
static void entmax_vjp(const double *p, const double *g, size_t n, double alpha, double *dx) {
    double su = 0.0, sug = 0.0;
    size_t i;
    for (i = 0; i < n; i++) {
        dx[i] = p[i] > 0.0 ? pow(p[i], 2.0 - alpha) : 0.0;
        su += dx[i];
        sug += dx[i] * g[i];
    }
    for (i = 0; i < n; i++) dx[i] = su > 0.0 ? dx[i] * (g[i] - sug / su) : 0.0;
}

/* ---------------------------------------------------------------- the corpus loop */
typedef struct { char file[32], field[16], cls[48]; unsigned long passed, failed, skipped; } tally;
static tally tallies[64];
static size_t n_tallies;

static tally *count(const char *file, const char *field, const char *cls) {
    size_t i;
    for (i = 0; i < n_tallies; i++)
        if (!strcmp(tallies[i].file, file) && !strcmp(tallies[i].field, field) && !strcmp(tallies[i].cls, cls))
            return &tallies[i];
    if (n_tallies == sizeof tallies / sizeof *tallies) return &tallies[n_tallies - 1];
    snprintf(tallies[n_tallies].file, 32, "%s", file);
    snprintf(tallies[n_tallies].field, 16, "%s", field);
    snprintf(tallies[n_tallies].cls, 48, "%s", cls);
    return &tallies[n_tallies++];
}

/* Compare field name (n values got against the case's name_hex): 1 passed, 0 failed (a line
 * printed unless quiet), -1 not compared (an exact float64 field this implementation cannot meet). */
static int check_field(const char *file, const ec_value *c, const char *name, const double *got, size_t n, int quiet) {
    double *expected;
    size_t i;
    int ok = 1;
    tally *t = count(file, name, ec_class(c, name));
    if (!EXACT_FLOAT64 && !strcmp(ec_str(c, "dtype"), "float64") && !strcmp(ec_class(c, name), "exact")) {
        t->skipped++;
        return -1;
    }
    expected = (double *)malloc((n ? n : 1) * sizeof *expected);
    if (!expected || ec_count(ec_field(c, name)) != n) { free(expected); t->failed++; return 0; }
    ec_numbers(ec_field(c, name), expected);
    for (i = 0; i < n && ok; i++) {
        if (!ec_within(c, name, i, n, got[i], expected[i])) {
            ok = 0;
            if (!quiet)
                printf("%s %s %s[%lu]: got %a, expected %a, bound %a (%s)\n", strcmp(ec_str(c, "verdict"), "acceptable")
                       ? "FAIL" : "ACCEPTABLE", ec_str(c, "tcId"), name, (unsigned long)i, got[i], expected[i],
                       ec_bound(c, name, i, n), ec_class(c, name));
        }
    }
    free(expected);
    if (ok) t->passed++; else t->failed++;
    return ok;
}

/* One case of entmax.jsonl or entmax_vjp.jsonl: 1 passed, 0 failed, -1 skipped, -2 an acceptable difference. */
static int check_case(const char *file, const ec_value *c) {
    size_t n = ec_count(ec_field(c, "x"));
    double alpha = ec_entry(c, "alpha", 0, 1), tau = 0.0, got_support;
    double *x = (double *)malloc(5 * n * sizeof *x + 1), *p = x + n, *g = p + n, *out = g + n, *work = out + n;
    long support = 0;
    int status, results[3], k, compared = 0, ok = 1, acceptable = !strcmp(ec_str(c, "verdict"), "acceptable");
    if (!x) return 0;
    ec_numbers(ec_field(c, "x"), x);  /* exact values of the case's dtype */
    if (!strcmp(file, "entmax_vjp.jsonl")) {
        ec_numbers(ec_field(c, "p"), p);
        ec_numbers(ec_field(c, "grad"), g);
        entmax_vjp(p, g, n, alpha, out);
        results[0] = check_field(file, c, "dx", out, n, 0);
        free(x);
        return results[0] < 0 ? -1 : results[0] ? 1 : acceptable ? -2 : 0;
    }
    status = entmax(x, n, alpha, p, &tau, &support, work);
    if (status == 1) { free(x); count(file, "p", ec_class(c, "p"))->skipped++; return -1; }
    if (ec_get(c, "error") && ec_get(c, "error")->type == EC_STRING && status == 2) {
        free(x);
        count(file, "error", ec_str(c, "error"))->passed++;
        return 1;  /* an error was expected, and reported */
    }
    if (status == 2) {
        printf("FAIL %s error: reported an error for scores the corpus solves\n", ec_str(c, "tcId"));
        free(x);
        count(file, "error", "none")->failed++;
        return 0;
    }
    got_support = (double)support;
    results[0] = check_field(file, c, "p", p, n, 0);
    results[1] = check_field(file, c, "tau", &tau, 1, results[0] == 0);
    results[2] = check_field(file, c, "support", &got_support, 1, results[0] == 0 || results[1] == 0);
    for (k = 0; k < 3; k++) {
        compared += results[k] >= 0;
        ok &= results[k] != 0;
    }
    free(x);
    return !compared ? -1 : ok ? 1 : acceptable ? -2 : 0;
}

int main(int argc, char **argv) {
    static const char *files[] = {"entmax.jsonl", "entmax_vjp.jsonl"};
    char path[4096], err[200], *line;
    unsigned long passed = 0, failed = 0, skipped = 0, acceptable = 0;
    size_t f, i;
    FILE *fp;
    if (argc != 2) { fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]); return 2; }
    for (f = 0; f < 2; f++) {
        snprintf(path, sizeof path, "%s/%s", argv[1], files[f]);
        if (!(fp = fopen(path, "r"))) { fprintf(stderr, "cannot open %s\n", path); return 2; }
        while ((line = ec_read_line(fp)) != NULL) {
            ec_value c;
            const ec_value *fmt;
            int r;
            if (ec_parse(line, &c, err, sizeof err) != 0) { fprintf(stderr, "%s: %s\n", path, err); return 2; }
            free(line);
            fmt = ec_get(ec_get(&c, "schema"), "format");
            if (!fmt || fmt->type != EC_NUMBER || fmt->number != EC_FORMAT_MAJOR) {
                fprintf(stderr, "%s: not a format %d corpus\n", path, EC_FORMAT_MAJOR);
                return 2;
            }
            r = check_case(files[f], &c);
            passed += r == 1; failed += r == 0; skipped += r == -1; acceptable += r == -2;
            ec_free(&c);
        }
        fclose(fp);
    }
    for (i = 0; i < n_tallies; i++)
        printf("%s %s %s: %lu passed, %lu failed, %lu skipped\n", tallies[i].file, tallies[i].field, tallies[i].cls,
               tallies[i].passed, tallies[i].failed, tallies[i].skipped);
    printf("%lu passed, %lu failed, %lu skipped", passed, failed, skipped);
    if (acceptable) printf(", %lu acceptable differences", acceptable);
    printf("\n");
    return failed || !passed ? 1 : 0;
}
