//! The `lsgd:policy` contract (0.1 to 0.5) as plain Rust, plus the reference policies.
//!
//! The same code runs in two places: natively inside `lsgd-host` (its own train-state and
//! parameter types, and the native side of the native-vs-wasm benchmark) and compiled to
//! `wasm32-wasip2` inside each reference plugin. Keeping one copy of every formula is what lets
//! the host check that a plugin returns the native answer bit for bit; [`NAMES`] lists the
//! reference policies and [`native`] builds the native twin of one by name ([`LAYER_RATE_NAMES`]
//! and [`native_layer_rate`] for the layer-rate policies of contract 0.3, [`SYNC_NAMES`] and
//! [`native_sync`] for the sync policies of contract 0.5).
//!
//! A guest crate exports a policy with two lines:
//!
//! ```ignore
//! wit_bindgen::generate!({ path: "../../wit/v0.1.0", world: "schedule-plugin" });
//! lsgd_policy::export_schedule!(lsgd_policy::warmup::Warmup);
//! ```
//!
//! Contract 0.3 adds two kinds of policy: layer-wise rates ([`LayerRate`], exported with
//! `export_layer_rate!`) and policies that keep state between calls ([`Stateful`], exported with
//! `export_stateful_schedule!` and its siblings for the other kinds), whose snapshot the host
//! checkpoints.
//!
//! Contract 0.4 adds the schedule's `momentum` ([`Schedule::momentum`], `None` unless a policy
//! drives it); a crate that generated a 0.4 world exports it with `export_schedule!(T, momentum)`
//! or `export_stateful_schedule!(T, momentum)`. The torch-compatible step schedules
//! ([`one_cycle`], [`linear`], [`multistep`], [`cosine_annealing`]) target 0.4.
//!
//! Contract 0.5 adds sync policies ([`SyncPolicy`]: which steps the ranks take on their own,
//! when they average, and the outer step on the averaged pseudo-gradient), exported with
//! `export_sync!` or, keeping state, `export_stateful_sync!`: [`local_sgd`],
//! [`post_local_sgd`], [`diloco`] and the stateful [`adaptive_period`].

#![warn(missing_docs)]

mod export;
mod layer_rate;
mod params;
mod sync;
mod util;

pub mod adaptive_period;
pub mod batch_ramp;
pub mod constant;
pub mod constant_batch;
pub mod cosine;
pub mod cosine_annealing;
pub mod diloco;
pub mod label_smoothing;
pub mod lamb;
pub mod lars;
pub mod linear;
pub mod local_sgd;
pub mod lr;
pub mod multistep;
pub mod one_cycle;
pub mod plateau;
pub mod poly;
pub mod post_local_sgd;
pub mod warmup;

pub use layer_rate::{
    LAYER_RATE_NAMES, LayerRate, NativeLayerRateFn, Role, TensorNorms, native_layer_rate,
};
pub use params::Params;
pub use sync::{
    NativeSync, OuterStep, SYNC_NAMES, StepKind, SyncPolicy, SyncTwin, TensorDrift, Window,
    native_sync,
};

/// Everything a policy may know about training at one step; field-for-field the WIT `train-state`.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct State {
    /// Optimiser step about to be taken, 0-based.
    pub step: u64,
    /// Current epoch, 0-based: floor(epoch_fraction).
    pub epoch: u32,
    /// Fractional epoch e = samples_seen / (samples per epoch), the clock every reference policy uses.
    pub epoch_fraction: f64,
    /// Steps one epoch takes at the current global batch.
    pub steps_per_epoch: u64,
    /// Steps the whole run takes if the global batch stays as it is now.
    pub total_steps: u64,
    /// Epochs the run trains for; the end point of cosine, poly and label-smoothing ramps.
    pub total_epochs: u32,
    /// Samples consumed before this step, over all ranks.
    pub samples_seen: u64,
    /// Global batch of this step; a batch-size policy sees the configured batch and scales it.
    pub global_batch: u32,
    /// Samples per worker: global_batch / world_size.
    pub worker_batch: u32,
    /// Number of data-parallel workers; batch-size policies round to a multiple of it.
    pub world_size: u32,
    /// Learning rate that applies at `reference_batch` samples.
    pub base_lr: f64,
    /// Batch at which `base_lr` applies: the denominator of the scaling rules.
    pub reference_batch: u32,
    /// Training loss of the previous step, if any step has run.
    pub last_loss: Option<f64>,
    /// Most recent evaluation metric, if any.
    pub last_metric: Option<f64>,
}

/// Copies every train-state field of `$src` into a `$dst` struct literal: the one list of
/// fields through which the host and the guests convert between [`State`] and their generated
/// WIT `TrainState` types.
#[macro_export]
macro_rules! copy_train_state {
    ($src:expr => $dst:path) => {{
        let s = $src;
        $dst {
            step: s.step,
            epoch: s.epoch,
            epoch_fraction: s.epoch_fraction,
            steps_per_epoch: s.steps_per_epoch,
            total_steps: s.total_steps,
            total_epochs: s.total_epochs,
            samples_seen: s.samples_seen,
            global_batch: s.global_batch,
            worker_batch: s.worker_batch,
            world_size: s.world_size,
            base_lr: s.base_lr,
            reference_batch: s.reference_batch,
            last_loss: s.last_loss,
            last_metric: s.last_metric,
        }
    }};
}

/// The type of a parameter, so the host can parse command-line text before `configure`.
#[derive(Clone, Debug, PartialEq)]
pub enum ParamType {
    /// `true` or `false`.
    Boolean,
    /// A signed 64-bit integer.
    Integer,
    /// A 64-bit float.
    Float,
    /// Free text.
    Text,
    /// Comma-separated floats on the command line, e.g. `30,60,80`.
    FloatList,
    /// One of the listed words, delivered as [`Value::Text`].
    Choice(Vec<String>),
}

/// A parameter value, as the host hands it to `configure`.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// For [`ParamType::Boolean`].
    Boolean(bool),
    /// For [`ParamType::Integer`].
    Integer(i64),
    /// For [`ParamType::Float`].
    Float(f64),
    /// For [`ParamType::Text`] and [`ParamType::Choice`].
    Text(String),
    /// For [`ParamType::FloatList`].
    FloatList(Vec<f64>),
}

/// One parameter a policy accepts; `lsgd-host inspect` prints these.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamSpec {
    /// snake_case name, addressed as `--set <kind>.<name>=<value>`.
    pub name: String,
    /// What the host must parse the user's text into.
    pub ty: ParamType,
    /// Used when the user gives no value; `None` makes the parameter required.
    pub default: Option<Value>,
    /// One line for `lsgd-host inspect`.
    pub doc: String,
}

/// What a policy says about itself (the WIT `plugin-info`).
#[derive(Clone, Debug, PartialEq)]
pub struct Info {
    /// Short name, e.g. `warmup`.
    pub name: String,
    /// The policy's own version, independent of the contract's.
    pub version: String,
    /// One-line summary.
    pub summary: String,
    /// Every parameter `configure` accepts, in the order the host passes them.
    pub params: Vec<ParamSpec>,
}

impl ParamSpec {
    /// Builds a spec from borrowed text, since every reference policy writes them as literals.
    pub fn new(name: &str, ty: ParamType, default: Option<Value>, doc: &str) -> Self {
        ParamSpec {
            name: name.to_owned(),
            ty,
            default,
            doc: doc.to_owned(),
        }
    }

    /// A float parameter with a default.
    pub fn float(name: &str, default: f64, doc: &str) -> Self {
        Self::new(name, ParamType::Float, Some(Value::Float(default)), doc)
    }

    /// A boolean parameter with a default.
    pub fn boolean(name: &str, default: bool, doc: &str) -> Self {
        Self::new(name, ParamType::Boolean, Some(Value::Boolean(default)), doc)
    }

    /// An integer parameter with a default.
    pub fn integer(name: &str, default: i64, doc: &str) -> Self {
        Self::new(name, ParamType::Integer, Some(Value::Integer(default)), doc)
    }

    /// A float-list parameter with a default.
    pub fn float_list(name: &str, default: &[f64], doc: &str) -> Self {
        Self::new(
            name,
            ParamType::FloatList,
            Some(Value::FloatList(default.to_vec())),
            doc,
        )
    }

    /// A choice parameter whose default is its first word, so the list reads default-first.
    pub fn choice(name: &str, words: &[&str], doc: &str) -> Self {
        let words: Vec<String> = words.iter().map(|w| (*w).to_owned()).collect();
        let default = words.first().cloned().map(Value::Text);
        Self::new(name, ParamType::Choice(words), default, doc)
    }
}

impl Info {
    /// Builds an info record; every reference policy is version 1.0.0.
    pub fn new(name: &str, summary: &str, params: Vec<ParamSpec>) -> Self {
        Info {
            name: name.to_owned(),
            version: "1.0.0".to_owned(),
            summary: summary.to_owned(),
            params,
        }
    }
}

/// What every policy kind shares: self-description and validated configuration.
pub trait Policy: Sized {
    /// Name, version, summary and parameters; must not depend on configuration.
    fn info() -> Info;

    /// Builds the policy from resolved parameters, rejecting out-of-range values with a message
    /// that names the parameter and the value.
    fn configure(params: &Params) -> Result<Self, String>;

    /// The policy as `info()`'s defaults configure it, used when the host never calls `configure`.
    fn from_defaults() -> Result<Self, String> {
        Self::configure(&Params::defaults(&Self::info().params))
    }
}

/// A learning-rate schedule (WIT interface `schedule`).
pub trait Schedule: Policy {
    /// The learning rate for `s.step`: finite and >= 0 for sane inputs.
    fn learning_rate(&self, s: &State) -> f64;

    /// The momentum (SGD's coefficient, AdamW's beta1) for `s.step`, in [0, 1); `None` keeps the
    /// configured one. Contract 0.4 only: the host asks right after `learning_rate`, same state.
    fn momentum(&self, _s: &State) -> Option<f64> {
        None
    }
}

/// A batch-size controller (WIT interface `batch-size`).
pub trait BatchSize: Policy {
    /// The global batch for `s.step`: >= 1 and a multiple of `s.world_size`.
    fn global_batch(&self, s: &State) -> u32;
}

/// A label-smoothing policy (WIT interface `label-smoothing`).
pub trait LabelSmoothing: Policy {
    /// The smoothing epsilon for `s.step`, in [0, 1).
    fn epsilon(&self, s: &State) -> f32;
}

/// A policy that keeps state between calls (contract 0.3's `state` interface), such as
/// ReduceLROnPlateau's best value and counters.
pub trait Stateful: Policy {
    /// Advances the state with what `s` shows; the export macro calls it right before the kind's
    /// policy function (for a 0.4 schedule: `learning_rate`, not `momentum`; for a sync policy:
    /// `plan`, not `outer_step`), on every call, so it must be idempotent for repeated calls at
    /// one step.
    fn observe(&mut self, s: &State);

    /// The state, in a form only [`Stateful::restore`] of the same policy reads.
    fn snapshot(&self) -> Vec<u8>;

    /// Replaces the state with an earlier snapshot, refusing one it cannot read.
    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String>;
}

/// Every per-step reference policy's name, which is both its plugin file (`warmup.wasm` ...) and
/// its `describe()` name, in the order `bench policies` reports them.
pub const NAMES: [&str; 12] = [
    "warmup",
    "cosine",
    "poly",
    "constant",
    "plateau",
    "one-cycle",
    "linear",
    "multistep",
    "cosine-annealing",
    "batch-ramp",
    "constant-batch",
    "label-smoothing",
];

/// A reference policy compiled natively: its output for a state, widened to f64 (exact for
/// every kind), as the host compares it with the plugin's.
pub type NativeFn = Box<dyn FnMut(&State) -> f64 + Send>;

/// `P` configured with `params` over its defaults, as the host's `configure` call would.
pub(crate) fn configure_given<P: Policy>(params: &Params) -> Result<P, String> {
    P::configure(&Params::resolve(&P::info().params, params.0.clone())?)
}

/// The native twin of the reference policy named `name` (its `describe()` name), configured
/// with `params` over its defaults; `None` for a name that is not a reference policy. A
/// stateful policy's twin keeps its state in the closure and observes before every call, as
/// the export macro does. A schedule's twin gives its learning rate; [`native_momentum`] gives
/// its momentum.
pub fn native(name: &str, params: &Params) -> Option<Result<NativeFn, String>> {
    use configure_given as configure;
    fn schedule<P: Schedule + Send + 'static>(params: &Params) -> Result<NativeFn, String> {
        let p = configure::<P>(params)?;
        Ok(Box::new(move |s| p.learning_rate(s)))
    }
    fn stateful_schedule<P: Schedule + Stateful + Send + 'static>(
        params: &Params,
    ) -> Result<NativeFn, String> {
        let mut p = configure::<P>(params)?;
        Ok(Box::new(move |s| {
            p.observe(s);
            p.learning_rate(s)
        }))
    }
    fn batch<P: BatchSize + Send + 'static>(params: &Params) -> Result<NativeFn, String> {
        let p = configure::<P>(params)?;
        Ok(Box::new(move |s| f64::from(p.global_batch(s))))
    }
    fn smoothing<P: LabelSmoothing + Send + 'static>(params: &Params) -> Result<NativeFn, String> {
        let p = configure::<P>(params)?;
        Ok(Box::new(move |s| f64::from(p.epsilon(s))))
    }
    Some(match name {
        "warmup" => schedule::<warmup::Warmup>(params),
        "cosine" => schedule::<cosine::Cosine>(params),
        "poly" => schedule::<poly::Poly>(params),
        "constant" => schedule::<constant::Constant>(params),
        "plateau" => stateful_schedule::<plateau::Plateau>(params),
        "one-cycle" => schedule::<one_cycle::OneCycle>(params),
        "linear" => schedule::<linear::Linear>(params),
        "multistep" => schedule::<multistep::MultiStep>(params),
        "cosine-annealing" => schedule::<cosine_annealing::CosineAnnealing>(params),
        "batch-ramp" => batch::<batch_ramp::BatchRamp>(params),
        "constant-batch" => batch::<constant_batch::ConstantBatch>(params),
        "label-smoothing" => smoothing::<label_smoothing::Smoothing>(params),
        _ => return None,
    })
}

/// A reference schedule's momentum compiled natively; `None` keeps the configured momentum.
pub type NativeMomentumFn = Box<dyn FnMut(&State) -> Option<f64> + Send>;

/// The native twin of the momentum (contract 0.4) of the reference schedule named `name`,
/// configured as [`native`] configures its learning rate; `None` for a name that is not a
/// reference schedule. A stateful schedule's twin observes before every call: a twin of its own
/// cannot rely on a `learning_rate` call having observed the step, and observing is idempotent.
pub fn native_momentum(name: &str, params: &Params) -> Option<Result<NativeMomentumFn, String>> {
    use configure_given as configure;
    fn schedule<P: Schedule + Send + 'static>(params: &Params) -> Result<NativeMomentumFn, String> {
        let p = configure::<P>(params)?;
        Ok(Box::new(move |s| p.momentum(s)))
    }
    fn stateful_schedule<P: Schedule + Stateful + Send + 'static>(
        params: &Params,
    ) -> Result<NativeMomentumFn, String> {
        let mut p = configure::<P>(params)?;
        Ok(Box::new(move |s| {
            p.observe(s);
            p.momentum(s)
        }))
    }
    Some(match name {
        "warmup" => schedule::<warmup::Warmup>(params),
        "cosine" => schedule::<cosine::Cosine>(params),
        "poly" => schedule::<poly::Poly>(params),
        "constant" => schedule::<constant::Constant>(params),
        "plateau" => stateful_schedule::<plateau::Plateau>(params),
        "one-cycle" => schedule::<one_cycle::OneCycle>(params),
        "linear" => schedule::<linear::Linear>(params),
        "multistep" => schedule::<multistep::MultiStep>(params),
        "cosine-annealing" => schedule::<cosine_annealing::CosineAnnealing>(params),
        _ => return None,
    })
}

#[cfg(test)]
mod registry_tests {
    use super::*;
    use testing::state_at;

    #[test]
    fn every_name_has_a_native_twin_with_its_defaults() {
        for name in NAMES {
            let mut f = native(name, &Params::default())
                .unwrap_or_else(|| panic!("{name} is not in the registry"))
                .unwrap_or_else(|e| panic!("{name} with its defaults: {e}"));
            assert!(f(&state_at(1.0)).is_finite(), "{name}");
        }
    }

    #[test]
    fn each_twin_is_the_policy_of_that_describe_name() {
        let names = [
            warmup::Warmup::info().name,
            cosine::Cosine::info().name,
            poly::Poly::info().name,
            constant::Constant::info().name,
            plateau::Plateau::info().name,
            one_cycle::OneCycle::info().name,
            linear::Linear::info().name,
            multistep::MultiStep::info().name,
            cosine_annealing::CosineAnnealing::info().name,
            batch_ramp::BatchRamp::info().name,
            constant_batch::ConstantBatch::info().name,
            label_smoothing::Smoothing::info().name,
        ];
        assert_eq!(names, NAMES);
    }

    #[test]
    fn parameters_reach_the_twin_and_are_checked() {
        let given = |name: &str, v: Value| Params(vec![(name.to_owned(), v)]);
        let mut ramp = native("batch-ramp", &Params::default()).unwrap().unwrap();
        assert_eq!(ramp(&state_at(89.0)), 8.0 * 8192.0);
        let mut capped = native("batch-ramp", &given("max_batch", Value::Integer(8192)))
            .unwrap()
            .unwrap();
        assert_eq!(capped(&state_at(89.0)), 8192.0);
        let e = native("warmup", &given("no_such", Value::Float(1.0)))
            .unwrap()
            .err()
            .unwrap();
        assert!(e.contains("unknown parameter 'no_such'"), "{e}");
    }

    #[test]
    fn momentum_twins_exist_for_schedules_only() {
        let mut cycle = native_momentum("one-cycle", &Params::default())
            .unwrap()
            .unwrap();
        let s = State {
            total_steps: 100,
            ..state_at(0.0)
        };
        assert_eq!(cycle(&s), Some(0.95));
        let mut plateau = native_momentum("plateau", &Params::default())
            .unwrap()
            .unwrap();
        assert_eq!(plateau(&s), None);
        assert!(native_momentum("batch-ramp", &Params::default()).is_none());
        let schedules = NAMES
            .iter()
            .filter(|n| native_momentum(n, &Params::default()).is_some())
            .count();
        assert_eq!(schedules, 9);
    }

    #[test]
    fn unknown_names_are_none() {
        assert!(native("int8", &Params::default()).is_none());
        assert!(native("", &Params::default()).is_none());
        assert!(native("Warmup", &Params::default()).is_none());
    }
}

#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// Goyal's ImageNet setting: 8k batch on 32 workers, 0.1 per 256 samples, 90 epochs.
    pub fn state_at(e: f64) -> State {
        State {
            epoch: e as u32,
            epoch_fraction: e,
            total_epochs: 90,
            global_batch: 8192,
            worker_batch: 256,
            world_size: 32,
            base_lr: 0.1,
            reference_batch: 256,
            ..State::default()
        }
    }

    /// Configures `P` with its defaults overridden by `set`.
    pub fn configure<P: Policy>(set: &[(&str, Value)]) -> Result<P, String> {
        let given = set
            .iter()
            .map(|(n, v)| ((*n).to_owned(), v.clone()))
            .collect();
        P::configure(&Params::resolve(&P::info().params, given)?)
    }

    /// The message `configure` rejects `set` with.
    pub fn error<P: Policy + std::fmt::Debug>(set: &[(&str, Value)]) -> String {
        configure::<P>(set).unwrap_err()
    }

    /// Text value from a literal, for choice parameters.
    pub fn text(s: &str) -> Value {
        Value::Text(s.to_owned())
    }
}
