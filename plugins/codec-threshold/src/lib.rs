//! The `threshold` codec as a component; the algorithm lives in `lsgd_codec::threshold`.

wit_bindgen::generate!({ path: "../../wit/v0.2.0", world: "codec-plugin" });
lsgd_codec::export_codec!(lsgd_codec::threshold::Threshold);
