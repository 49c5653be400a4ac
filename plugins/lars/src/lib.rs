//! The `lars` layer-rate policy (You et al. 2017) as a component; the formula lives in `lsgd_policy::lars`.

wit_bindgen::generate!({ path: "../../wit/v0.3.0", world: "layer-rate-plugin" });
lsgd_policy::export_layer_rate!(lsgd_policy::lars::Lars);
