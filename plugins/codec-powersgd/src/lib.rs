//! The `powersgd` codec as a component; the algorithm lives in `lsgd_codec::powersgd`. It
//! targets contract 0.4, whose codec state carries the agreed Q from step to step (warm start).

wit_bindgen::generate!({ path: "../../wit/v0.4.0", world: "codec-plugin" });
lsgd_codec::export_codec!(lsgd_codec::powersgd::PowerSgd, state);
