/* lsgd_kit.h: helpers for lsgd:policy plugins in C, on top of the bindings `lsgd-plugin-build
 * c-bindings` generates next to this file (lsgd.h). Header-only; one plugin is one .c file.
 *
 * The host passes every parameter, type-checked, to configure(); lsgd_resolve() still applies the
 * declared defaults and checks names and types the way the Rust plugins do, so a plugin behaves
 * the same when called by any host. Messages match the Rust reference plugins word for word.
 *
 * lsgd-plugin-build writes this file with a few lines in front of it: LSGD_POLICY_VERSION (the
 * contract version, "0.4.0") and, for a stateful-* world, LSGD_STATEFUL, which brings in the
 * snapshot/restore helpers at the end. From contract 0.4 a schedule's momentum is optional: a
 * plugin that does not define exports_lsgd_policy_schedule_momentum answers none (lsgd.c has a
 * weak default). */
#ifndef LSGD_KIT_H
#define LSGD_KIT_H

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lsgd.h"

typedef lsgd_policy_types_param_spec_t lsgd_spec_t;
typedef lsgd_policy_types_param_value_t lsgd_value_t;
typedef lsgd_policy_types_train_state_t lsgd_state_t;

/* ---- describe() ---------------------------------------------------------------------------- */

static void lsgd_info(exports_lsgd_policy_plugin_plugin_info_t *info, const char *name,
                      const char *version, const char *summary, lsgd_spec_t *specs, size_t n) {
  lsgd_string_dup(&info->name, name);
  lsgd_string_dup(&info->version, version);
  lsgd_string_dup(&info->summary, summary);
  /* describe()'s post-return frees the list: hand over a heap copy. */
  info->params.ptr = malloc(n * sizeof *specs);
  memcpy(info->params.ptr, specs, n * sizeof *specs);
  info->params.len = n;
}

static lsgd_spec_t lsgd_spec(const char *name, uint8_t type, const char *doc) {
  lsgd_spec_t s;
  memset(&s, 0, sizeof s);
  lsgd_string_dup(&s.name, name);
  s.type.tag = type;
  lsgd_string_dup(&s.doc, doc);
  return s;
}

static lsgd_spec_t lsgd_spec_float(const char *name, double def, const char *doc) {
  lsgd_spec_t s = lsgd_spec(name, LSGD_POLICY_TYPES_PARAM_TYPE_FLOAT, doc);
  s.default_.is_some = true;
  s.default_.val.tag = LSGD_POLICY_TYPES_PARAM_VALUE_FLOAT;
  s.default_.val.val.float_ = def;
  return s;
}

static lsgd_spec_t lsgd_spec_integer(const char *name, int64_t def, const char *doc) {
  lsgd_spec_t s = lsgd_spec(name, LSGD_POLICY_TYPES_PARAM_TYPE_INTEGER, doc);
  s.default_.is_some = true;
  s.default_.val.tag = LSGD_POLICY_TYPES_PARAM_VALUE_INTEGER;
  s.default_.val.val.integer = def;
  return s;
}

static lsgd_spec_t lsgd_spec_float_list(const char *name, const double *def, size_t n,
                                        const char *doc) {
  lsgd_spec_t s = lsgd_spec(name, LSGD_POLICY_TYPES_PARAM_TYPE_FLOAT_LIST, doc);
  s.default_.is_some = true;
  s.default_.val.tag = LSGD_POLICY_TYPES_PARAM_VALUE_FLOAT_LIST;
  s.default_.val.val.float_list.ptr = malloc(n * sizeof(double) + 1);
  memcpy(s.default_.val.val.float_list.ptr, def, n * sizeof(double));
  s.default_.val.val.float_list.len = n;
  return s;
}

/* A choice whose default is its first word, as in the Rust reference plugins. */
static lsgd_spec_t lsgd_spec_choice(const char *name, const char *const *words, size_t n,
                                    const char *doc) {
  lsgd_spec_t s = lsgd_spec(name, LSGD_POLICY_TYPES_PARAM_TYPE_CHOICE, doc);
  s.type.val.choice.ptr = malloc(n * sizeof(lsgd_string_t) + 1);
  s.type.val.choice.len = n;
  for (size_t i = 0; i < n; i++) lsgd_string_dup(&s.type.val.choice.ptr[i], words[i]);
  s.default_.is_some = true;
  s.default_.val.tag = LSGD_POLICY_TYPES_PARAM_VALUE_TEXT;
  lsgd_string_dup(&s.default_.val.val.text, words[0]);
  return s;
}

/* ---- configure() --------------------------------------------------------------------------- */

/* Resolved parameter values in declaration order; they borrow from the specs and the host's list. */
typedef struct {
  size_t n;
  const lsgd_spec_t *specs;
  const lsgd_value_t *values[32];
} lsgd_params_t;

/* Writes a formatted message into *err (configure's error out-parameter); returns false. */
__attribute__((format(printf, 2, 3))) static bool lsgd_fail(lsgd_string_t *err, const char *fmt,
                                                            ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  lsgd_string_dup(err, buf);
  return false;
}

/* `v` as Rust's `{}` prints an f64: the shortest digits that read back to `v`, never an
 * exponent, so error messages match the Rust plugins'. `buf` needs 400 bytes. */
static const char *lsgd_fmt_f64(char *buf, double v) {
  if (isnan(v)) return strcpy(buf, "NaN");
  if (isinf(v)) return strcpy(buf, v < 0 ? "-inf" : "inf");
  char e[40];
  for (int prec = 0; prec < 17; prec++) {
    snprintf(e, sizeof e, "%.*e", prec, v);
    if (strtod(e, NULL) == v) break;
  }
  /* e is [-]d[.ddd]e(+|-)XX: collect the digits and the decimal exponent. */
  char digits[20];
  size_t nd = 0;
  const char *p = e;
  char *out = buf;
  if (*p == '-') *out++ = *p++;
  for (; *p != 'e'; p++)
    if (*p != '.') digits[nd++] = *p;
  int exp = atoi(p + 1);
  while (nd > 1 && digits[nd - 1] == '0') nd--;
  int point = exp + 1; /* digits before the decimal point */
  if (point <= 0) {
    out += sprintf(out, "0.");
    for (int i = 0; i < -point; i++) *out++ = '0';
    memcpy(out, digits, nd);
    out += nd;
  } else {
    for (int i = 0; i < point; i++) *out++ = (size_t)i < nd ? digits[i] : '0';
    if ((size_t)point < nd) {
      *out++ = '.';
      memcpy(out, digits + point, nd - point);
      out += nd - point;
    }
  }
  *out = 0;
  return buf;
}

static bool lsgd_str_eq(const lsgd_string_t *s, const char *c) {
  return s->len == strlen(c) && memcmp(s->ptr, c, s->len) == 0;
}

static const char *lsgd_kind_name(uint8_t tag) {
  switch (tag) {
    case LSGD_POLICY_TYPES_PARAM_VALUE_BOOLEAN: return "a boolean";
    case LSGD_POLICY_TYPES_PARAM_VALUE_INTEGER: return "an integer";
    case LSGD_POLICY_TYPES_PARAM_VALUE_FLOAT: return "a float";
    case LSGD_POLICY_TYPES_PARAM_VALUE_TEXT: return "text";
    default: return "a list of floats";
  }
}

/* The value tag a spec's type expects (a choice is delivered as text). */
static uint8_t lsgd_expected_tag(const lsgd_spec_t *s) {
  return s->type.tag == LSGD_POLICY_TYPES_PARAM_TYPE_CHOICE ? LSGD_POLICY_TYPES_PARAM_VALUE_TEXT
                                                            : s->type.tag;
}

/* Overlays the host's `given` values on the defaults of `specs`: unknown names, wrong types,
 * words outside a choice and missing required values are errors, as in lsgd_policy::Params. */
static bool lsgd_resolve(const exports_lsgd_policy_plugin_plugin_info_t *info,
                         const exports_lsgd_policy_plugin_list_param_t *given, lsgd_params_t *out,
                         lsgd_string_t *err) {
  const lsgd_spec_t *specs = info->params.ptr;
  out->n = info->params.len;
  out->specs = specs;
  for (size_t i = 0; i < out->n; i++)
    out->values[i] = specs[i].default_.is_some ? &specs[i].default_.val : NULL;
  for (size_t g = 0; g < given->len; g++) {
    const lsgd_policy_types_param_t *p = &given->ptr[g];
    size_t i = 0;
    while (i < out->n && !(specs[i].name.len == p->name.len &&
                           memcmp(specs[i].name.ptr, p->name.ptr, p->name.len) == 0))
      i++;
    if (i == out->n) {
      char known[512] = "";
      for (size_t j = 0; j < out->n; j++)
        snprintf(known + strlen(known), sizeof known - strlen(known), "%s%.*s", j ? ", " : "",
                 (int)specs[j].name.len, specs[j].name.ptr);
      return lsgd_fail(err, "unknown parameter '%.*s' (accepted: %s)", (int)p->name.len,
                       p->name.ptr, out->n ? known : "none");
    }
    const lsgd_spec_t *s = &specs[i];
    uint8_t want = lsgd_expected_tag(s);
    if (p->value.tag != want)
      return lsgd_fail(err, "parameter '%.*s' must be %s, got %s", (int)s->name.len, s->name.ptr,
                       lsgd_kind_name(want), lsgd_kind_name(p->value.tag));
    if (s->type.tag == LSGD_POLICY_TYPES_PARAM_TYPE_CHOICE) {
      bool found = false;
      char words[512] = "";
      for (size_t j = 0; j < s->type.val.choice.len; j++) {
        const lsgd_string_t *w = &s->type.val.choice.ptr[j];
        found |= w->len == p->value.val.text.len &&
                 memcmp(w->ptr, p->value.val.text.ptr, w->len) == 0;
        snprintf(words + strlen(words), sizeof words - strlen(words), "%s%.*s", j ? ", " : "",
                 (int)w->len, w->ptr);
      }
      if (!found)
        return lsgd_fail(err, "parameter '%.*s' must be one of %s, got '%.*s'", (int)s->name.len,
                         s->name.ptr, words, (int)p->value.val.text.len, p->value.val.text.ptr);
    }
    out->values[i] = &p->value;
  }
  for (size_t i = 0; i < out->n; i++)
    if (!out->values[i])
      return lsgd_fail(err, "missing required parameter '%.*s'", (int)specs[i].name.len,
                       specs[i].name.ptr);
  return true;
}

/* The resolved value of `name`, or NULL if the plugin did not declare it. */
static const lsgd_value_t *lsgd_get(const lsgd_params_t *p, const char *name) {
  for (size_t i = 0; i < p->n; i++)
    if (lsgd_str_eq(&p->specs[i].name, name)) return p->values[i];
  return NULL;
}

static double lsgd_float(const lsgd_params_t *p, const char *name) {
  return lsgd_get(p, name)->val.float_;
}

static int64_t lsgd_integer(const lsgd_params_t *p, const char *name) {
  return lsgd_get(p, name)->val.integer;
}

static const lsgd_string_t *lsgd_text(const lsgd_params_t *p, const char *name) {
  return &lsgd_get(p, name)->val.text;
}

static const lsgd_list_f64_t *lsgd_float_list(const lsgd_params_t *p, const char *name) {
  return &lsgd_get(p, name)->val.float_list;
}

/* A finite float `>= min`, else an error naming it (lsgd_policy's float_at_least). */
static bool lsgd_float_at_least(const lsgd_params_t *p, const char *name, double min, double *out,
                                lsgd_string_t *err) {
  double v = lsgd_float(p, name);
  char a[400], b[400];
  if (!(isfinite(v) && v >= min))
    return lsgd_fail(err, "%s must be >= %s, got %s", name, lsgd_fmt_f64(a, min),
                     lsgd_fmt_f64(b, v));
  *out = v;
  return true;
}

/* An integer in [min, 2^32-1] (lsgd_policy's u32_at_least). */
static bool lsgd_u32_at_least(const lsgd_params_t *p, const char *name, uint32_t min,
                              uint32_t *out, lsgd_string_t *err) {
  int64_t v = lsgd_integer(p, name);
  if (v < (int64_t)min || v > (int64_t)UINT32_MAX)
    return lsgd_fail(err, "%s must be in [%u, %u], got %lld", name, min, UINT32_MAX,
                     (long long)v);
  *out = (uint32_t)v;
  return true;
}

/* Epoch milestones: finite, >= 0 and ascending (lsgd_policy's milestones). At most 64. */
static bool lsgd_milestones(const lsgd_params_t *p, const char *name, double *out, size_t *n,
                            lsgd_string_t *err) {
  const lsgd_list_f64_t *l = lsgd_float_list(p, name);
  double prev = 0.0;
  char a[400], b[400];
  if (l->len > 64) return lsgd_fail(err, "%s: at most 64 values", name);
  for (size_t i = 0; i < l->len; i++) {
    double m = l->ptr[i];
    if (!(isfinite(m) && m >= 0.0))
      return lsgd_fail(err, "%s must all be >= 0, got %s", name, lsgd_fmt_f64(a, m));
    if (m < prev)
      return lsgd_fail(err, "%s must be ascending, got %s after %s", name, lsgd_fmt_f64(a, m),
                       lsgd_fmt_f64(b, prev));
    prev = m;
    out[i] = m;
  }
  *n = l->len;
  return true;
}

/* How many milestones the fractional epoch `e` has reached (e >= m). */
static size_t lsgd_passed(const double *milestones, size_t n, double e) {
  size_t i = 0;
  while (i < n && e >= milestones[i]) i++;
  return i;
}

/* ---- snapshot() and restore(), in a stateful-* world ---------------------------------------- */

#ifdef LSGD_STATEFUL
/* snapshot()'s result: a heap copy of the `n` bytes at `state`, which the bindings free after
 * the host has read it. */
static void lsgd_snapshot(lsgd_list_u8_t *ret, const void *state, size_t n) {
  ret->ptr = malloc(n ? n : 1);
  if (!ret->ptr) abort();
  memcpy(ret->ptr, state, n);
  ret->len = n;
}

/* restore(): copies a snapshot of exactly `n` bytes into `state`, else an error naming both
 * sizes (the Rust plugins' words); frees the list, which the bindings hand over. */
static bool lsgd_restore(lsgd_list_u8_t *snapshot, void *state, size_t n, lsgd_string_t *err) {
  bool ok = snapshot->len == n;
  if (ok)
    memcpy(state, snapshot->ptr, n);
  else
    lsgd_fail(err, "a snapshot of %zu bytes, expected %zu", snapshot->len, n);
  lsgd_list_u8_free(snapshot);
  return ok;
}
#endif

#endif
