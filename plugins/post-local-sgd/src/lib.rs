//! The `post-local-sgd` sync policy (Lin et al. 2018; PyTorch's PeriodicModelAverager) as a
//! contract 0.5 component; the rule lives in `lsgd_policy::post_local_sgd`.

wit_bindgen::generate!({ path: "../../wit/v0.5.0", world: "sync-plugin" });
lsgd_policy::export_sync!(lsgd_policy::post_local_sgd::PostLocalSgd);
