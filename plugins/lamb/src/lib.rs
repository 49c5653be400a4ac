//! The `lamb` layer-rate policy (You et al. 2019) as a component; the formula lives in `lsgd_policy::lamb`.

wit_bindgen::generate!({ path: "../../wit/v0.3.0", world: "layer-rate-plugin" });
lsgd_policy::export_layer_rate!(lsgd_policy::lamb::Lamb);
