//! Test guest: a batch-size policy that returns its `batch` parameter cast to u32 with no
//! checks, so the host's validation of zero, non-divisible and huge batches can be tested.

wit_bindgen::generate!({ path: "../../../wit/v0.1.0", world: "batch-size-plugin" });

use lsgd_policy::{BatchSize, Info, ParamSpec, Params, Policy, State};

/// Returns whatever it was configured with.
struct BadBatch {
    batch: i64,
}

impl Policy for BadBatch {
    fn info() -> Info {
        Info::new(
            "bad-batch",
            "Test guest: returns its batch parameter unchecked",
            vec![ParamSpec::integer(
                "batch",
                0,
                "global batch to return, cast to u32 (negatives wrap)",
            )],
        )
    }

    fn configure(p: &Params) -> Result<Self, String> {
        Ok(BadBatch {
            batch: p.integer("batch")?,
        })
    }
}

impl BatchSize for BadBatch {
    fn global_batch(&self, _s: &State) -> u32 {
        self.batch as u32
    }
}

lsgd_policy::export_batch_size!(BadBatch);
