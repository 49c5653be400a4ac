//! The `label-smoothing` policy as a component; the formula lives in `lsgd_policy::label_smoothing`.

wit_bindgen::generate!({ path: "../../wit/v0.1.0", world: "label-smoothing-plugin" });
lsgd_policy::export_label_smoothing!(lsgd_policy::label_smoothing::Smoothing);
