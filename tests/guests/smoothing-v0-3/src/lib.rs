//! Test guest: the reference label-smoothing policy built against 0.3.0's
//! `label-smoothing-plugin` world, which (unlike 0.2.0's) exports no `codec`, so the host's
//! handling of a 0.3 label-smoothing plugin can be tested.

wit_bindgen::generate!({ path: "../../../wit/v0.3.0", world: "label-smoothing-plugin" });
lsgd_policy::export_label_smoothing!(lsgd_policy::label_smoothing::Smoothing);
