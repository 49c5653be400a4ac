/* {{name}}: a layer-wise rate policy for lsgd-host. Edit describe, configure and multipliers;
 * the host calls describe once, configure once, then multipliers every step with the norms of
 * every parameter tensor, and scales the step's learning rate for tensor i by the i-th
 * multiplier (one per tensor, each finite and >= 0). lsgd_kit.h (written by lsgd-plugin-build
{{^stateful}}
 * next to the bindings) has the describe/configure helpers.
{{/stateful}}
{{#stateful}}
 * next to the bindings) has the describe/configure and snapshot/restore helpers.
{{/stateful}}
 *
 * This one is LARS (You et al., 2017): a weight's multiplier is its trust ratio
 * coefficient x ||w|| / (||g|| + weight_decay x ||w||); biases, BatchNorm parameters and tensors
{{^stateful}}
 * with a zero norm keep the schedule's rate (multiplier 1). */
{{/stateful}}
{{#stateful}}
 * with a zero norm keep the schedule's rate (multiplier 1).
 *
 * It keeps state between calls: the best metric seen so far, which lowers the coefficient to
 * coefficient x (1 - best) as the metric rises, and which the host saves with snapshot and brings
 * back with restore. */
{{/stateful}}
#include "lsgd_kit.h"

/* Set by configure; a fresh instance (the host makes one after any fault) starts at the default. */
static double coefficient = 0.001;
{{#stateful}}

/* The state: the best metric (test accuracy) seen so far, 0 before the first. It changes in the
 * policy calls, starts afresh with new parameters, and travels as its 8 bytes (an f64, wasm being
 * little-endian) through snapshot and restore. */
static double best = 0.0;
{{/stateful}}

void exports_lsgd_policy_plugin_describe(exports_lsgd_policy_plugin_plugin_info_t *ret) {
  lsgd_spec_t specs[] = {
      lsgd_spec_float("coefficient", 0.001, "LARS trust coefficient (>= 0)"),
  };
{{^stateful}}
  lsgd_info(ret, "{{name}}", "0.1.0",
            "LARS: coefficient x ||w|| / (||g|| + wd x ||w||) per weight, 1 elsewhere", specs, 1);
{{/stateful}}
{{#stateful}}
  lsgd_info(ret, "{{name}}", "0.1.0",
            "LARS with the coefficient x (1 - the best metric so far) per weight, 1 elsewhere",
            specs, 1);
{{/stateful}}
}

bool exports_lsgd_policy_plugin_configure(exports_lsgd_policy_plugin_list_param_t *params,
                                          lsgd_string_t *err) {
  exports_lsgd_policy_plugin_plugin_info_t info;
  exports_lsgd_policy_plugin_describe(&info);
  lsgd_params_t p;
  double c;
  bool ok = lsgd_resolve(&info, params, &p, err) &&
            lsgd_float_at_least(&p, "coefficient", 0.0, &c, err);
  if (ok) coefficient = c;
{{#stateful}}
  if (ok) best = 0.0; /* new parameters, a new state */
{{/stateful}}
  exports_lsgd_policy_plugin_plugin_info_free(&info);
  exports_lsgd_policy_plugin_list_param_free(params);
  return ok;
}

/* LARS's local learning rate of one tensor: finite and >= 0 for any finite norms. */
static double trust_ratio(const exports_lsgd_policy_layer_rate_tensor_norms_t *t) {
  double w = t->weight_norm, g = t->grad_norm;
  if (t->role != EXPORTS_LSGD_POLICY_LAYER_RATE_ROLE_WEIGHT || !(w > 0.0 && g > 0.0)) return 1.0;
  return coefficient{{#stateful}} * (1.0 - best){{/stateful}} * w / (g + t->weight_decay * w);
}

void exports_lsgd_policy_layer_rate_multipliers(
    exports_lsgd_policy_layer_rate_train_state_t *s,
    exports_lsgd_policy_layer_rate_list_tensor_norms_t *tensors, lsgd_list_f64_t *ret) {
{{#stateful}}
  /* Taking the larger value twice changes nothing: the host may call again at the same step. */
  if (s->last_metric.is_some && s->last_metric.val > best) best = s->last_metric.val;
{{/stateful}}
  /* Exactly one multiplier per tensor, in the order of `tensors`. The list is ours to free; the
   * result is freed by the bindings after the host has read it. */
  ret->len = tensors->len;
  ret->ptr = tensors->len ? malloc(tensors->len * sizeof(double)) : NULL;
  if (tensors->len && !ret->ptr) abort();
  for (size_t i = 0; i < tensors->len; i++) ret->ptr[i] = trust_ratio(&tensors->ptr[i]);
  exports_lsgd_policy_layer_rate_list_tensor_norms_free(tensors);
}
{{#stateful}}

void exports_lsgd_policy_state_snapshot(lsgd_list_u8_t *ret) {
  lsgd_snapshot(ret, &best, sizeof best);
}

bool exports_lsgd_policy_state_restore(lsgd_list_u8_t *snapshot, lsgd_string_t *err) {
  return lsgd_restore(snapshot, &best, sizeof best, err);
}
{{/stateful}}
