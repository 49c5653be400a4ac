/* {{name}}: a label-smoothing policy for lsgd-host. Edit describe, configure and epsilon;
 * the host calls describe once, configure once, then epsilon every step. lsgd_kit.h
{{^stateful}}
 * (written by lsgd-plugin-build next to the bindings) has the describe/configure helpers. */
{{/stateful}}
{{#stateful}}
 * (written by lsgd-plugin-build next to the bindings) has the describe/configure and
 * snapshot/restore helpers.
 *
 * It keeps state between calls: the best metric seen so far, which lowers epsilon as the metric
 * rises, and which the host saves with snapshot and brings back with restore. */
{{/stateful}}
#include "lsgd_kit.h"

/* Set by configure; a fresh instance (the host makes one after any fault) starts at the default. */
static float epsilon = 0.1f;
{{#stateful}}

/* The state: the best metric (test accuracy) seen so far, 0 before the first. It changes in the
 * policy calls, starts afresh with new parameters, and travels as its 8 bytes (an f64, wasm being
 * little-endian) through snapshot and restore. */
static double best = 0.0;
{{/stateful}}

void exports_lsgd_policy_plugin_describe(exports_lsgd_policy_plugin_plugin_info_t *ret) {
  lsgd_spec_t specs[] = {
      lsgd_spec_float("epsilon", 0.1, "label-smoothing epsilon, in [0, 1)"),
  };
{{^stateful}}
  lsgd_info(ret, "{{name}}", "0.1.0", "A constant label-smoothing epsilon", specs, 1);
{{/stateful}}
{{#stateful}}
  lsgd_info(ret, "{{name}}", "0.1.0", "epsilon x (1 - the best metric so far)", specs, 1);
{{/stateful}}
}

bool exports_lsgd_policy_plugin_configure(exports_lsgd_policy_plugin_list_param_t *params,
                                          lsgd_string_t *err) {
  exports_lsgd_policy_plugin_plugin_info_t info;
  exports_lsgd_policy_plugin_describe(&info);
  lsgd_params_t p;
  bool ok = lsgd_resolve(&info, params, &p, err);
  if (ok) {
    double e = lsgd_float(&p, "epsilon");
    char buf[400];
    /* Checked after the f32 conversion the contract requires: 0.999999999 rounds to 1. */
    if (!(e >= 0.0 && (float)e < 1.0f))
      ok = lsgd_fail(err, "epsilon must be in [0, 1), got %s", lsgd_fmt_f64(buf, e));
    else
      epsilon = (float)e;
  }
{{#stateful}}
  if (ok) best = 0.0; /* new parameters, a new state */
{{/stateful}}
  exports_lsgd_policy_plugin_plugin_info_free(&info);
  exports_lsgd_policy_plugin_list_param_free(params);
  return ok;
}

float exports_lsgd_policy_label_smoothing_epsilon(
    exports_lsgd_policy_label_smoothing_train_state_t *s) {
{{^stateful}}
  return epsilon;
{{/stateful}}
{{#stateful}}
  /* Taking the larger value twice changes nothing: the host may call again at the same step. */
  if (s->last_metric.is_some && s->last_metric.val > best) best = s->last_metric.val;
  /* Computed in f64 and rounded to f32 once, as in every language. */
  return (float)((double)epsilon * (1.0 - best));
{{/stateful}}
}
{{#stateful}}

void exports_lsgd_policy_state_snapshot(lsgd_list_u8_t *ret) {
  lsgd_snapshot(ret, &best, sizeof best);
}

bool exports_lsgd_policy_state_restore(lsgd_list_u8_t *snapshot, lsgd_string_t *err) {
  return lsgd_restore(snapshot, &best, sizeof best, err);
}
{{/stateful}}
