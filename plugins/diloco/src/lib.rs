//! The `diloco` sync policy (Douillard et al. 2023) as a contract 0.5 component; the rule and
//! the outer step live in `lsgd_policy::diloco`.

wit_bindgen::generate!({ path: "../../wit/v0.5.0", world: "sync-plugin" });
lsgd_policy::export_sync!(lsgd_policy::diloco::Diloco);
