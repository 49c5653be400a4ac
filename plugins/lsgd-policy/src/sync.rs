//! The `sync` interface of contract 0.5 (when the ranks synchronise and how the outer step on
//! the averaged pseudo-gradient is taken) as plain Rust.

use crate::util::{float_at_least, float_below, u32_at_least};
use crate::{
    ParamSpec, Params, Policy, Role, State, Stateful, adaptive_period, configure_given, diloco,
    local_sgd, post_local_sgd,
};

/// How one step moves (the WIT `step-kind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StepKind {
    /// The gradients are summed over the ranks before the update, as without a sync policy;
    /// only at the start of a window.
    Synchronous,
    /// Each rank updates its own weights from its own gradients; nothing is exchanged.
    Local,
    /// A local step that ends the window: the ranks then average their pseudo-gradients and the
    /// host takes the outer step.
    Average,
}

impl StepKind {
    /// The WIT case name, as traces and messages write it.
    pub fn name(self) -> &'static str {
        match self {
            StepKind::Synchronous => "synchronous",
            StepKind::Local => "local",
            StepKind::Average => "average",
        }
    }

    /// The kind named by [`StepKind::name`].
    pub fn from_name(name: &str) -> Option<StepKind> {
        [StepKind::Synchronous, StepKind::Local, StepKind::Average]
            .into_iter()
            .find(|k| k.name() == name)
    }

    /// Whether the ranks hold the same weights after a step of this kind.
    pub fn agrees(self) -> bool {
        self != StepKind::Local
    }
}

/// Where the run stands in its synchronisation windows (the WIT `window`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
pub struct Window {
    /// Local steps taken since the ranks last agreed on the weights, not counting this one.
    pub local_steps: u32,
    /// Windows ended so far: outer steps taken.
    pub windows: u64,
}

impl Window {
    /// The window after a step of `kind`: one more local step, or a fresh window (and, after
    /// `average`, one more window ended).
    pub fn after(self, kind: StepKind) -> Window {
        match kind {
            StepKind::Local => Window {
                local_steps: self.local_steps + 1,
                ..self
            },
            StepKind::Synchronous => Window {
                local_steps: 0,
                ..self
            },
            StepKind::Average => Window {
                local_steps: 0,
                windows: self.windows + 1,
            },
        }
    }
}

/// One parameter tensor at the end of a window (the WIT `tensor-drift`); norms in f64.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorDrift {
    /// The parameter's name, e.g. `conv1.weight`.
    pub name: String,
    /// Its shape, outermost first.
    pub shape: Vec<u32>,
    /// Weight, bias or BatchNorm.
    pub role: Role,
    /// ‖θ_global‖: the weights the ranks agreed on at the window's start.
    pub weight_norm: f64,
    /// ‖Δ‖: the pseudo-gradient averaged over the ranks.
    pub delta_norm: f64,
    /// sqrt(mean_k ‖θ_global − θ_k‖²): the ranks' own pseudo-gradients, before averaging.
    pub rank_delta_norm: f64,
    /// ‖m‖: the outer momentum buffer before this outer step.
    pub momentum_norm: f64,
    /// ⟨Δ, m⟩.
    pub delta_dot_momentum: f64,
}

/// The outer step (the WIT `outer-step`), in `torch.optim.SGD`'s form with dampening 0.
#[derive(Clone, Debug, PartialEq)]
pub struct OuterStep {
    /// The outer learning rate: finite and >= 0.
    pub lr: f64,
    /// The outer momentum: finite and in [0, 1).
    pub momentum: f64,
    /// Nesterov's form of the momentum.
    pub nesterov: bool,
    /// A multiplier of `lr` per tensor, each finite and >= 0; empty for 1 everywhere.
    pub lr_scale: Vec<f64>,
}

impl OuterStep {
    /// Plain averaging: θ_global becomes the ranks' mean (local SGD, Federated Averaging).
    pub fn average() -> OuterStep {
        OuterStep {
            lr: 1.0,
            momentum: 0.0,
            nesterov: false,
            lr_scale: Vec::new(),
        }
    }
}

/// A synchronisation policy (WIT interface `sync`). Named so as not to shadow `std`'s `Sync`.
pub trait SyncPolicy: Policy {
    /// How step `s.step` moves, given where the run stands in its windows.
    fn plan(&self, s: &State, w: &Window) -> StepKind;

    /// The outer step of the window `s.step` ended (`w` as [`SyncPolicy::plan`] saw it). A
    /// stateful policy may update its state here from the window's drift; the host may repeat
    /// the call for one window (a retry), so such an update must happen once per `w.windows`.
    fn outer_step(&mut self, s: &State, w: &Window, tensors: &[TensorDrift]) -> OuterStep;
}

/// The reference sync policies, by `describe()` name; separate from [`crate::NAMES`] because
/// their native twins take a window and tensors and answer with a step kind or an outer step.
pub const SYNC_NAMES: [&str; 4] = ["local-sgd", "post-local-sgd", "diloco", "adaptive-period"];

/// A reference sync policy compiled natively: what the host calls where it would call the
/// plugin, so that the two can be compared call for call.
pub trait SyncTwin {
    /// [`SyncPolicy::plan`]; a stateful twin observes `s` first, as the export macro does.
    fn plan(&mut self, s: &State, w: &Window) -> StepKind;

    /// [`SyncPolicy::outer_step`]; never observes, as the export macro does not.
    fn outer_step(&mut self, s: &State, w: &Window, tensors: &[TensorDrift]) -> OuterStep;

    /// The policy's [`Stateful::snapshot`], `None` for a stateless policy.
    fn snapshot(&self) -> Option<Vec<u8>> {
        None
    }

    /// The policy's [`Stateful::restore`]; a stateless policy has nothing to restore and says so.
    fn restore(&mut self, _snapshot: &[u8]) -> Result<(), String> {
        Err("this sync policy keeps no state to restore".to_owned())
    }
}

/// A reference sync policy's native twin, configured and ready to call.
pub type NativeSync = Box<dyn SyncTwin + Send>;

/// A stateless policy as a twin.
struct Plain<P>(P);

impl<P: SyncPolicy> SyncTwin for Plain<P> {
    fn plan(&mut self, s: &State, w: &Window) -> StepKind {
        self.0.plan(s, w)
    }

    fn outer_step(&mut self, s: &State, w: &Window, tensors: &[TensorDrift]) -> OuterStep {
        self.0.outer_step(s, w, tensors)
    }
}

/// A stateful policy as a twin: observes before `plan`, exposes its snapshot.
struct Observed<P>(P);

impl<P: SyncPolicy + Stateful> SyncTwin for Observed<P> {
    fn plan(&mut self, s: &State, w: &Window) -> StepKind {
        self.0.observe(s);
        self.0.plan(s, w)
    }

    fn outer_step(&mut self, s: &State, w: &Window, tensors: &[TensorDrift]) -> OuterStep {
        self.0.outer_step(s, w, tensors)
    }

    fn snapshot(&self) -> Option<Vec<u8>> {
        Some(self.0.snapshot())
    }

    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
        self.0.restore(snapshot)
    }
}

/// The native twin of the sync policy named `name` (its `describe()` name), configured with
/// `params` over its defaults; `None` for a name not in [`SYNC_NAMES`].
pub fn native_sync(name: &str, params: &Params) -> Option<Result<NativeSync, String>> {
    fn plain<P: SyncPolicy + Send + 'static>(params: &Params) -> Result<NativeSync, String> {
        Ok(Box::new(Plain(configure_given::<P>(params)?)))
    }
    fn observed<P: SyncPolicy + Stateful + Send + 'static>(
        params: &Params,
    ) -> Result<NativeSync, String> {
        Ok(Box::new(Observed(configure_given::<P>(params)?)))
    }
    Some(match name {
        "local-sgd" => plain::<local_sgd::LocalSgd>(params),
        "post-local-sgd" => plain::<post_local_sgd::PostLocalSgd>(params),
        "diloco" => plain::<diloco::Diloco>(params),
        "adaptive-period" => observed::<adaptive_period::AdaptivePeriod>(params),
        _ => return None,
    })
}

/// The `period` parameter (H) every periodic reference policy has.
pub(crate) fn period_spec(default: i64, doc: &str) -> ParamSpec {
    ParamSpec::integer("period", default, doc)
}

/// A window length H: at least one step, and no more than a `window.local-steps` can count.
pub(crate) fn period(p: &Params, name: &str) -> Result<u32, String> {
    u32_at_least(p, name, 1)
}

/// Whether step `step` ends a period of H = `period` steps: steps H − 1, 2H − 1 ..., so that
/// every window, the first included, is H steps long.
pub(crate) fn ends_period(step: u64, period: u32) -> bool {
    let h = u64::from(period);
    step % h == h - 1
}

/// The outer step's parameters (`outer_lr`, `outer_momentum`, `nesterov`) with the given
/// defaults, for the policies that let the user choose the outer optimizer.
pub(crate) fn outer_specs(lr: f64, momentum: f64, nesterov: bool) -> Vec<ParamSpec> {
    vec![
        ParamSpec::float(
            "outer_lr",
            lr,
            "outer learning rate (>= 0); 1 with momentum 0 is plain averaging",
        ),
        ParamSpec::float(
            "outer_momentum",
            momentum,
            "outer momentum, in [0, 1); 0 keeps no momentum buffer",
        ),
        ParamSpec::boolean(
            "nesterov",
            nesterov,
            "Nesterov's form of the outer momentum",
        ),
    ]
}

/// The outer step that [`outer_specs`]' parameters describe, checked against the ranges the
/// host enforces on the output, so a bad value is refused at `configure`, not at a window's end.
pub(crate) fn outer_from_params(p: &Params) -> Result<OuterStep, String> {
    Ok(OuterStep {
        lr: float_at_least(p, "outer_lr", 0.0)?,
        momentum: float_below(p, "outer_momentum", 0.0, 1.0)?,
        nesterov: p.boolean("nesterov")?,
        lr_scale: Vec::new(),
    })
}

#[cfg(test)]
pub(crate) mod testing {
    use super::*;
    use crate::testing::state_at;

    /// Step `step` of a run of `total` steps on 2 ranks (Fashion-MNIST at batch 1024).
    pub fn at(step: u64, total: u64) -> State {
        State {
            step,
            steps_per_epoch: 59,
            total_steps: total,
            global_batch: 1024,
            worker_batch: 512,
            world_size: 2,
            ..state_at(0.0)
        }
    }

    /// The kinds `plan` gives over the first `n` steps of a run of `total` steps, each step seeing
    /// the window the earlier answers left (the host's final-step rule not applied).
    pub fn plans(policy: &mut dyn SyncTwin, n: u64, total: u64) -> Vec<StepKind> {
        let mut w = Window::default();
        (0..n)
            .map(|step| {
                let kind = policy.plan(&at(step, total), &w);
                w = w.after(kind);
                kind
            })
            .collect()
    }

    /// The letters of `p`'s plans over the first `n` steps of a long run, each step seeing the
    /// window the earlier answers left.
    pub fn plan_letters<P: SyncPolicy>(p: &P, n: u64) -> String {
        let mut w = Window::default();
        let kinds: Vec<StepKind> = (0..n)
            .map(|step| {
                let k = p.plan(&at(step, 1000), &w);
                w = w.after(k);
                k
            })
            .collect();
        letters(&kinds)
    }

    /// The kinds as letters (S, L, A), so a sequence reads like the docs write it.
    pub fn letters(kinds: &[StepKind]) -> String {
        kinds
            .iter()
            .map(|k| match k {
                StepKind::Synchronous => 'S',
                StepKind::Local => 'L',
                StepKind::Average => 'A',
            })
            .collect()
    }

    /// One tensor's drift: ‖Δ‖ (averaged) and the ranks' own root-mean-square ‖Δ_k‖.
    pub fn drift(delta: f64, rank_delta: f64) -> TensorDrift {
        TensorDrift {
            name: "conv1.weight".to_owned(),
            shape: vec![32, 1, 3, 3],
            role: Role::Weight,
            weight_norm: 4.0,
            delta_norm: delta,
            rank_delta_norm: rank_delta,
            momentum_norm: 0.0,
            delta_dot_momentum: 0.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{at, drift, letters, plans};
    use super::*;
    use crate::Value;

    #[test]
    fn every_sync_name_has_a_twin_of_that_describe_name() {
        assert_eq!(
            [
                local_sgd::LocalSgd::info().name,
                post_local_sgd::PostLocalSgd::info().name,
                diloco::Diloco::info().name,
                adaptive_period::AdaptivePeriod::info().name,
            ],
            SYNC_NAMES
        );
        for name in SYNC_NAMES {
            let mut twin = native_sync(name, &Params::default())
                .unwrap_or_else(|| panic!("{name} is not in the registry"))
                .unwrap_or_else(|e| panic!("{name} with its defaults: {e}"));
            let kinds = plans(twin.as_mut(), 200, 200);
            assert!(kinds.contains(&StepKind::Average), "{name}: {kinds:?}");
            let o = twin.outer_step(&at(199, 200), &Window::default(), &[drift(1.0, 1.0)]);
            assert!(o.lr.is_finite() && o.lr >= 0.0, "{name}: {o:?}");
            assert!((0.0..1.0).contains(&o.momentum), "{name}: {o:?}");
            assert!(o.lr_scale.is_empty(), "{name}: {o:?}");
        }
    }

    #[test]
    fn twins_follow_their_parameters() {
        let given = |name: &str, v: Value| Params(vec![(name.to_owned(), v)]);
        let mut four = native_sync("local-sgd", &given("period", Value::Integer(4)))
            .unwrap()
            .unwrap();
        assert_eq!(letters(&plans(four.as_mut(), 8, 100)), "LLLALLLA");
        let e = native_sync("diloco", &given("outer_momentum", Value::Float(1.0)))
            .unwrap()
            .err()
            .unwrap();
        assert_eq!(e, "outer_momentum must be in [0, 1), got 1");
        let e = native_sync("local-sgd", &given("outer_lr", Value::Float(1.0)))
            .unwrap()
            .err()
            .unwrap();
        assert!(e.starts_with("unknown parameter 'outer_lr'"), "{e}");
    }

    #[test]
    fn only_the_stateful_twin_has_a_snapshot() {
        let mut local = native_sync("local-sgd", &Params::default())
            .unwrap()
            .unwrap();
        assert_eq!(local.snapshot(), None);
        assert!(local.restore(&[]).is_err());
        let adaptive = native_sync("adaptive-period", &Params::default())
            .unwrap()
            .unwrap();
        assert!(adaptive.snapshot().is_some_and(|s| !s.is_empty()));
    }

    #[test]
    fn unknown_and_other_kinds_names_are_none() {
        for name in ["warmup", "lars", "plateau", "", "DiLoCo", "local_sgd"] {
            assert!(native_sync(name, &Params::default()).is_none(), "{name}");
        }
    }

    #[test]
    fn periods_end_on_the_last_step_of_each() {
        let ends: Vec<u64> = (0..12).filter(|&s| ends_period(s, 4)).collect();
        assert_eq!(ends, [3, 7, 11]);
        assert!((0..5).all(|s| ends_period(s, 1)));
        assert!(
            ends_period(u64::MAX, 2),
            "no overflow at the end of the clock"
        );
    }

    #[test]
    fn windows_after_each_kind() {
        let w = Window {
            local_steps: 3,
            windows: 5,
        };
        assert_eq!(
            w.after(StepKind::Local),
            Window {
                local_steps: 4,
                windows: 5
            }
        );
        assert_eq!(
            w.after(StepKind::Average),
            Window {
                local_steps: 0,
                windows: 6
            }
        );
        assert_eq!(StepKind::from_name("average"), Some(StepKind::Average));
        assert_eq!(StepKind::from_name("Average"), None);
        assert!(StepKind::Synchronous.agrees() && !StepKind::Local.agrees());
    }
}
