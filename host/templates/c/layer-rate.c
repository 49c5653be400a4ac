/* {{name}}: a layer-wise rate policy for lsgd-host. Edit describe, configure and multipliers;
 * the host calls describe once, configure once, then multipliers every step with the norms of
 * every parameter tensor, and scales the step's learning rate for tensor i by the i-th
 * multiplier (one per tensor, each finite and >= 0). lsgd_kit.h (written by lsgd-plugin-build
 * next to the bindings) has the describe/configure helpers.
 *
 * This one is LARS (You et al., 2017): a weight's multiplier is its trust ratio
 * coefficient x ||w|| / (||g|| + weight_decay x ||w||); biases, BatchNorm parameters and tensors
 * with a zero norm keep the schedule's rate (multiplier 1). */
#include "lsgd_kit.h"

/* Set by configure; a fresh instance (the host makes one after any fault) starts at the default. */
static double coefficient = 0.001;

void exports_lsgd_policy_plugin_describe(exports_lsgd_policy_plugin_plugin_info_t *ret) {
  lsgd_spec_t specs[] = {
      lsgd_spec_float("coefficient", 0.001, "LARS trust coefficient (>= 0)"),
  };
  lsgd_info(ret, "{{name}}", "0.1.0",
            "LARS: coefficient x ||w|| / (||g|| + wd x ||w||) per weight, 1 elsewhere", specs, 1);
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
  exports_lsgd_policy_plugin_plugin_info_free(&info);
  exports_lsgd_policy_plugin_list_param_free(params);
  return ok;
}

/* LARS's local learning rate of one tensor: finite and >= 0 for any finite norms. */
static double trust_ratio(const exports_lsgd_policy_layer_rate_tensor_norms_t *t) {
  double w = t->weight_norm, g = t->grad_norm;
  if (t->role != EXPORTS_LSGD_POLICY_LAYER_RATE_ROLE_WEIGHT || !(w > 0.0 && g > 0.0)) return 1.0;
  return coefficient * w / (g + t->weight_decay * w);
}

void exports_lsgd_policy_layer_rate_multipliers(
    exports_lsgd_policy_layer_rate_train_state_t *s,
    exports_lsgd_policy_layer_rate_list_tensor_norms_t *tensors, lsgd_list_f64_t *ret) {
  /* Exactly one multiplier per tensor, in the order of `tensors`. The list is ours to free; the
   * result is freed by the bindings after the host has read it. */
  ret->len = tensors->len;
  ret->ptr = tensors->len ? malloc(tensors->len * sizeof(double)) : NULL;
  if (tensors->len && !ret->ptr) abort();
  for (size_t i = 0; i < tensors->len; i++) ret->ptr[i] = trust_ratio(&tensors->ptr[i]);
  exports_lsgd_policy_layer_rate_list_tensor_norms_free(tensors);
}
