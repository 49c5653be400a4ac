//! The `dgc` codec as a component; the algorithm lives in `lsgd_codec::dgc`.

wit_bindgen::generate!({ path: "../../wit/v0.2.0", world: "codec-plugin" });
lsgd_codec::export_codec!(lsgd_codec::dgc::Dgc);
