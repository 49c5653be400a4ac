/* {{name}}: a learning-rate schedule for lsgd-host. Edit describe, configure, learning_rate and
 * momentum; the host calls describe once, configure once, then learning_rate and momentum every
 * step. lsgd_kit.h (written by lsgd-plugin-build next to the bindings) has the describe/configure
{{^stateful}}
 * helpers. */
{{/stateful}}
{{#stateful}}
 * and snapshot/restore helpers.
 *
 * It keeps state between calls: the best metric seen so far, which lowers the rate as the metric
 * rises, and which the host saves with snapshot and brings back with restore. */
{{/stateful}}
#include "lsgd_kit.h"

/* Set by configure; a fresh instance (the host makes one after any fault) starts at the default. */
static double scale = 1.0;
{{#stateful}}

/* The state: the best metric (test accuracy) seen so far, 0 before the first. It changes in the
 * policy calls, starts afresh with new parameters, and travels as its 8 bytes (an f64, wasm being
 * little-endian) through snapshot and restore. */
static double best = 0.0;
{{/stateful}}

void exports_lsgd_policy_plugin_describe(exports_lsgd_policy_plugin_plugin_info_t *ret) {
  lsgd_spec_t specs[] = {
      lsgd_spec_float("scale", 1.0, "multiplier on the linearly scaled learning rate (>= 0)"),
  };
{{^stateful}}
  lsgd_info(ret, "{{name}}", "0.1.0", "A constant learning rate: base_lr x B/B_ref x scale",
            specs, 1);
{{/stateful}}
{{#stateful}}
  lsgd_info(ret, "{{name}}", "0.1.0", "base_lr x B/B_ref x scale x (1 - the best metric so far)",
            specs, 1);
{{/stateful}}
}

bool exports_lsgd_policy_plugin_configure(exports_lsgd_policy_plugin_list_param_t *params,
                                          lsgd_string_t *err) {
  exports_lsgd_policy_plugin_plugin_info_t info;
  exports_lsgd_policy_plugin_describe(&info);
  lsgd_params_t p;
  double s;
  bool ok = lsgd_resolve(&info, params, &p, err) && lsgd_float_at_least(&p, "scale", 0.0, &s, err);
  if (ok) scale = s;
{{#stateful}}
  if (ok) best = 0.0; /* new parameters, a new state */
{{/stateful}}
  exports_lsgd_policy_plugin_plugin_info_free(&info);
  exports_lsgd_policy_plugin_list_param_free(params);
  return ok;
}

double exports_lsgd_policy_schedule_learning_rate(exports_lsgd_policy_schedule_train_state_t *s) {
{{#stateful}}
  /* Taking the larger value twice changes nothing: the host may call again at the same step. */
  if (s->last_metric.is_some && s->last_metric.val > best) best = s->last_metric.val;
{{/stateful}}
  double ratio = s->reference_batch == 0 ? 1.0
                                         : (double)s->global_batch / (double)s->reference_batch;
  return s->base_lr * ratio * scale{{#stateful}} * (1.0 - best){{/stateful}};
}

/* The momentum of the step, asked right after learning_rate with the same state: store a value
 * in [0, 1) and return true to set SGD's momentum (AdamW's beta1) for the step, e.g.
 * `*ret = 0.9; return true;`; false keeps the configured one (--momentum, --adam-beta1), as does
 * leaving this function out (lsgd-plugin-build links a default that answers none). */
bool exports_lsgd_policy_schedule_momentum(exports_lsgd_policy_schedule_train_state_t *s,
                                           double *ret) {
  return false;
}
{{#stateful}}

void exports_lsgd_policy_state_snapshot(lsgd_list_u8_t *ret) {
  lsgd_snapshot(ret, &best, sizeof best);
}

bool exports_lsgd_policy_state_restore(lsgd_list_u8_t *snapshot, lsgd_string_t *err) {
  return lsgd_restore(snapshot, &best, sizeof best, err);
}
{{/stateful}}
