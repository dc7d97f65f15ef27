/* entmax_corpus.h: a single-file C99 reader of the entmax-ref conformance corpus (format 2).
 *
 * libc only.  Include it in one .c file (every function is static):
 *
 *     #include "entmax_corpus.h"
 *     ec_value c;  char err[200];
 *     char *line = ec_read_line(fp);                    // one JSON Lines record (malloc'd)
 *     if (ec_parse(line, &c, err, sizeof err) == 0) {
 *         const ec_value *x = ec_field(&c, "x");        // x_hex: the bit-exact form of field x
 *         double *xs = malloc(ec_count(x) * sizeof *xs);
 *         ec_numbers(x, xs);                            // strtod of each hex-float string
 *         ...
 *         ec_within(&c, "p", i, n, got, expected)       // the tolerance class of field p (n entries)
 *         ec_free(&c);
 *     }
 *
 * Numbers are read from the NAME_hex fields (C99 hex floats, "inf", "-inf", "nan"): strtod gives
 * each value exactly.  The tolerance classes (the line's "tol" object, the manifest's
 * "tolerance_classes") are "exact" and "abs:@FIELD"; ec_within implements them.
 */
#ifndef ENTMAX_CORPUS_H
#define ENTMAX_CORPUS_H

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EC_FORMAT_MAJOR 2

typedef enum { EC_NULL, EC_BOOL, EC_NUMBER, EC_STRING, EC_ARRAY, EC_OBJECT } ec_type;

typedef struct ec_value {
    ec_type type;
    int boolean;             /* EC_BOOL */
    double number;           /* EC_NUMBER */
    char *string;            /* EC_STRING (NUL-terminated, UTF-8) */
    size_t n;                /* EC_ARRAY, EC_OBJECT: number of items */
    struct ec_value *items;  /* EC_ARRAY, EC_OBJECT: the values */
    char **keys;             /* EC_OBJECT: the keys */
} ec_value;

typedef struct { const char *s; char *err; size_t errlen; } ec_parser;

static int ec_fail(ec_parser *p, const char *what) {
    if (p->errlen) snprintf(p->err, p->errlen, "%s near \"%.20s\"", what, p->s);
    return -1;
}

static void ec_ws(ec_parser *p) { while (*p->s == ' ' || *p->s == '\t' || *p->s == '\n' || *p->s == '\r') p->s++; }

static void ec_free(ec_value *v) {
    size_t i;
    if (v->type == EC_STRING) free(v->string);
    if (v->type == EC_ARRAY || v->type == EC_OBJECT) {
        for (i = 0; i < v->n; i++) {
            ec_free(&v->items[i]);
            if (v->type == EC_OBJECT) free(v->keys[i]);
        }
        free(v->items);
        free(v->keys);
    }
    v->type = EC_NULL;
}

static void ec_utf8(char **o, unsigned long c) {
    if (c < 0x80) { *(*o)++ = (char)c; return; }
    if (c < 0x800) { *(*o)++ = (char)(0xC0 | (c >> 6)); }
    else if (c < 0x10000) { *(*o)++ = (char)(0xE0 | (c >> 12)); *(*o)++ = (char)(0x80 | ((c >> 6) & 0x3F)); }
    else {
        *(*o)++ = (char)(0xF0 | (c >> 18)); *(*o)++ = (char)(0x80 | ((c >> 12) & 0x3F));
        *(*o)++ = (char)(0x80 | ((c >> 6) & 0x3F));
    }
    *(*o)++ = (char)(0x80 | (c & 0x3F));
}

static int ec_hex4(const char *s, unsigned long *c) {
    int i;
    *c = 0;
    for (i = 0; i < 4; i++) {
        int h = s[i];
        unsigned long d = (h >= '0' && h <= '9') ? (unsigned long)(h - '0') : (h >= 'a' && h <= 'f') ? (unsigned long)(h - 'a' + 10)
                        : (h >= 'A' && h <= 'F') ? (unsigned long)(h - 'A' + 10) : 99;
        if (d == 99) return -1;
        *c = *c * 16 + d;
    }
    return 0;
}

static int ec_string(ec_parser *p, char **out) {
    const char *s = ++p->s, *end = s;
    char *o;
    while (*end && *end != '"') end += (*end == '\\' && end[1]) ? 2 : 1;
    if (*end != '"') return ec_fail(p, "unterminated string");
    *out = o = (char *)malloc((size_t)(end - s) + 1);  /* escapes never lengthen the text */
    if (!o) return ec_fail(p, "out of memory");
    while (s < end) {
        unsigned long c, lo;
        if (*s != '\\') { *o++ = *s++; continue; }
        switch (s[1]) {
            case 'b': *o++ = '\b'; break;  case 'f': *o++ = '\f'; break;  case 'n': *o++ = '\n'; break;
            case 'r': *o++ = '\r'; break;  case 't': *o++ = '\t'; break;
            case 'u':
                if (ec_hex4(s + 2, &c)) { free(*out); return ec_fail(p, "bad \\u escape"); }
                s += 4;
                if (c >= 0xD800 && c < 0xDC00 && s[2] == '\\' && s[3] == 'u' && !ec_hex4(s + 4, &lo)) {
                    c = 0x10000 + ((c - 0xD800) << 10) + (lo - 0xDC00);
                    s += 6;
                }
                ec_utf8(&o, c);
                break;
            default: *o++ = s[1];  /* \" \\ \/ */
        }
        s += 2;
    }
    *o = '\0';
    p->s = end + 1;
    return 0;
}

static int ec_value_at(ec_parser *p, ec_value *v, int depth);

static int ec_push(ec_parser *p, ec_value *v, size_t *cap, char *key, int depth) {
    if (v->n == *cap) {
        size_t c = *cap ? 2 * *cap : 8;
        ec_value *items = (ec_value *)realloc(v->items, c * sizeof *items);
        if (items) v->items = items;
        if (items && v->type == EC_OBJECT) {
            char **keys = (char **)realloc(v->keys, c * sizeof *keys);
            if (keys) v->keys = keys; else items = NULL;
        }
        if (!items) { free(key); return ec_fail(p, "out of memory"); }
        *cap = c;
    }
    if (v->type == EC_OBJECT) v->keys[v->n] = key;
    v->items[v->n].type = EC_NULL;
    v->n++;
    if (ec_value_at(p, &v->items[v->n - 1], depth + 1)) return -1;
    return 0;
}

static int ec_container(ec_parser *p, ec_value *v, int depth) {
    size_t cap = 0;
    char close = v->type == EC_ARRAY ? ']' : '}';
    p->s++;
    ec_ws(p);
    if (*p->s == close) { p->s++; return 0; }
    for (;;) {
        char *key = NULL;
        ec_ws(p);
        if (v->type == EC_OBJECT) {
            if (*p->s != '"' || ec_string(p, &key)) return ec_fail(p, "expected a key");
            ec_ws(p);
            if (*p->s != ':') { free(key); return ec_fail(p, "expected ':'"); }
            p->s++;
        }
        if (ec_push(p, v, &cap, key, depth)) return -1;
        ec_ws(p);
        if (*p->s == ',') { p->s++; continue; }
        if (*p->s == close) { p->s++; return 0; }
        return ec_fail(p, "expected ',' or a closing bracket");
    }
}

static int ec_value_at(ec_parser *p, ec_value *v, int depth) {
    char *end;
    memset(v, 0, sizeof *v);
    if (depth > 64) return ec_fail(p, "nested too deeply");
    ec_ws(p);
    switch (*p->s) {
        case '"': v->type = EC_STRING; return ec_string(p, &v->string);
        case '[': v->type = EC_ARRAY; return ec_container(p, v, depth);
        case '{': v->type = EC_OBJECT; return ec_container(p, v, depth);
        case 't': if (strncmp(p->s, "true", 4) == 0) { v->type = EC_BOOL; v->boolean = 1; p->s += 4; return 0; } break;
        case 'f': if (strncmp(p->s, "false", 5) == 0) { v->type = EC_BOOL; p->s += 5; return 0; } break;
        case 'n': if (strncmp(p->s, "null", 4) == 0) { p->s += 4; return 0; } break;
        default:
            v->number = strtod(p->s, &end);
            if (end != p->s) { v->type = EC_NUMBER; p->s = end; return 0; }
    }
    return ec_fail(p, "unexpected character");
}

/* Parse one JSON text into *out (free it with ec_free).  Returns 0, or -1 with a message in err. */
static int ec_parse(const char *text, ec_value *out, char *err, size_t errlen) {
    ec_parser p;
    p.s = text; p.err = err; p.errlen = errlen;
    if (ec_value_at(&p, out, 0)) { ec_free(out); return -1; }
    ec_ws(&p);
    if (*p.s) { ec_free(out); return ec_fail(&p, "text after the value"); }
    return 0;
}

/* The value of key in an object, or NULL. */
static const ec_value *ec_get(const ec_value *obj, const char *key) {
    size_t i;
    if (!obj || obj->type != EC_OBJECT) return NULL;
    for (i = 0; i < obj->n; i++)
        if (strcmp(obj->keys[i], key) == 0) return &obj->items[i];
    return NULL;
}

/* The string of key in an object ("" when absent or not a string). */
static const char *ec_str(const ec_value *obj, const char *key) {
    const ec_value *v = ec_get(obj, key);
    return v && v->type == EC_STRING ? v->string : "";
}

/* How many numbers a (nested) array of number strings holds (1 for a single string, 0 for null). */
static size_t ec_count(const ec_value *v) {
    size_t i, n = 0;
    if (!v || v->type == EC_NULL) return 0;
    if (v->type != EC_ARRAY) return 1;
    for (i = 0; i < v->n; i++) n += ec_count(&v->items[i]);
    return n;
}

/* Decode a (nested) array of hex-float strings, row-major, into out; returns how many.
 * strtod reads C99 hex floats, "inf", "-inf" and "nan" exactly. */
static size_t ec_numbers(const ec_value *v, double *out) {
    size_t i, n = 0;
    if (!v || v->type == EC_NULL) return 0;
    if (v->type == EC_STRING) { out[0] = strtod(v->string, NULL); return 1; }
    if (v->type == EC_NUMBER) { out[0] = v->number; return 1; }
    for (i = 0; v->type == EC_ARRAY && i < v->n; i++) n += ec_numbers(&v->items[i], out + n);
    return n;
}

/* The exact numbers of field name in a case: name_hex (hex-float strings), or name itself for an
 * integer field (support, tol_support), which has no hex twin; NULL when absent. */
static const ec_value *ec_field(const ec_value *c, const char *name) {
    char key[64];
    snprintf(key, sizeof key, "%s_hex", name);
    return ec_get(c, key) ? ec_get(c, key) : ec_get(c, name);
}

/* Entry i of the numbers of field name in a case (0 when absent).  A field of fewer numbers
 * than `of` entries broadcasts (row-major): entry i uses number i * count / of (one number serves
 * every entry; one per row serves the row's entries). */
static double ec_entry(const ec_value *c, const char *name, size_t i, size_t of) {
    const ec_value *v = ec_field(c, name);
    double *all, r;
    size_t n;
    n = ec_count(v);
    if (n == 0) return 0.0;
    all = (double *)malloc(n * sizeof *all);
    if (!all) return NAN;
    ec_numbers(v, all);
    r = all[n == of ? i : of ? (i * n) / of : 0];
    free(all);
    return r;
}

/* The tolerance class of output field name in a case ("" when the case has none). */
static const char *ec_class(const ec_value *c, const char *name) { return ec_str(ec_get(c, "tol"), name); }

/* The bound on |got - expected| of entry i of output field name (n entries), by the field's
 * tolerance class (the case's "tol" object); -1 for a class this reader does not know. */
static double ec_bound(const ec_value *c, const char *name, size_t i, size_t n) {
    const char *cls = ec_class(c, name);
    if (strcmp(cls, "exact") == 0) return 0.0;
    if (strncmp(cls, "abs:@", 5) == 0) return ec_entry(c, cls + 5, i, n);
    return -1.0;
}

/* Whether result got matches entry i (of n, value expected) of output field name.  A non-finite
 * expected value must be matched exactly (NaN by NaN); 0 and -0 are equal. */
static int ec_within(const ec_value *c, const char *name, size_t i, size_t n, double got, double expected) {
    double bound = ec_bound(c, name, i, n);
    if (isnan(expected)) return isnan(got);
    if (isinf(expected)) return got == expected;
    return bound >= 0.0 && fabs(got - expected) <= bound;  /* false for a NaN result */
}

/* Read one line (without its newline) into a malloc'd buffer; NULL at the end of the file. */
static char *ec_read_line(FILE *f) {
    size_t cap = 1 << 16, len = 0;
    char *buf = (char *)malloc(cap);
    if (!buf) return NULL;
    while (fgets(buf + len, (int)(cap - len), f)) {
        len += strlen(buf + len);
        if (len && buf[len - 1] == '\n') { buf[--len] = '\0'; return buf; }
        if (len + 1 == cap) {
            char *more = (char *)realloc(buf, cap *= 2);
            if (!more) { free(buf); return NULL; }
            buf = more;
        }
    }
    if (len) return buf;
    free(buf);
    return NULL;
}

#endif /* ENTMAX_CORPUS_H */
