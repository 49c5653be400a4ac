//! The export macros, expanded natively: each module generates one world's bindings (with its
//! own `export_prefix`, so the exported symbols of the modules do not collide) and exports a
//! policy into it. wit-bindgen's `Guest` traits are plain Rust, so the tests call the "guest"
//! the way the host's bindings would, without a WebAssembly runtime: conversions, `observe`
//! before every call (but 0.4's `momentum`), and `snapshot`/`restore` are checked here, and `build-plugins.sh` checks
//! that the same expansions build as components.

use lsgd_policy::{Info, ParamSpec, Params, Policy, State, Stateful};

/// A train state at `step` of epoch `epoch` with an evaluation metric.
fn at(step: u64, epoch: u32, metric: Option<f64>) -> State {
    State {
        step,
        epoch,
        epoch_fraction: f64::from(epoch),
        global_batch: 256,
        worker_batch: 256,
        world_size: 1,
        base_lr: 0.1,
        reference_batch: 256,
        last_metric: metric,
        ..State::default()
    }
}

/// A stateful policy of every kind: counts the distinct steps it has observed.
#[derive(Debug, Default)]
struct Counter {
    last: Option<u64>,
    count: u32,
}

impl Policy for Counter {
    fn info() -> Info {
        Info::new(
            "counter",
            "counts observed steps",
            vec![ParamSpec::integer("start", 0, "initial count")],
        )
    }

    fn configure(p: &Params) -> Result<Self, String> {
        let count = u32::try_from(p.integer("start")?).map_err(|e| e.to_string())?;
        Ok(Counter { last: None, count })
    }
}

impl Stateful for Counter {
    fn observe(&mut self, s: &State) {
        if self.last.is_none_or(|l| s.step > l) {
            self.last = Some(s.step);
            self.count += 1;
        }
    }

    fn snapshot(&self) -> Vec<u8> {
        let mut out = self.count.to_le_bytes().to_vec();
        out.extend(self.last.unwrap_or(u64::MAX).to_le_bytes());
        out
    }

    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
        let [c0, c1, c2, c3, last @ ..] = snapshot else {
            return Err(format!("counter snapshot of {} bytes", snapshot.len()));
        };
        let last: [u8; 8] = last
            .try_into()
            .map_err(|_| "counter snapshot: bad length".to_owned())?;
        self.count = u32::from_le_bytes([*c0, *c1, *c2, *c3]);
        self.last = Some(u64::from_le_bytes(last)).filter(|&l| l != u64::MAX);
        Ok(())
    }
}

impl lsgd_policy::BatchSize for Counter {
    fn global_batch(&self, _s: &State) -> u32 {
        self.count
    }
}

impl lsgd_policy::LabelSmoothing for Counter {
    fn epsilon(&self, _s: &State) -> f32 {
        self.count as f32 / 100.0
    }
}

impl lsgd_policy::Schedule for Counter {
    fn learning_rate(&self, _s: &State) -> f64 {
        f64::from(self.count)
    }

    fn momentum(&self, _s: &State) -> Option<f64> {
        Some(f64::from(self.count) / 100.0)
    }
}

impl lsgd_policy::LayerRate for Counter {
    fn multipliers(&self, _s: &State, tensors: &[lsgd_policy::TensorNorms]) -> Vec<f64> {
        vec![f64::from(self.count); tensors.len()]
    }
}

/// As a sync policy the counter averages at odd counts and answers the count as outer lr, so a
/// test sees whether `plan` and `outer_step` observed.
impl lsgd_policy::SyncPolicy for Counter {
    fn plan(&self, _s: &State, _w: &lsgd_policy::Window) -> lsgd_policy::StepKind {
        if self.count % 2 == 1 {
            lsgd_policy::StepKind::Average
        } else {
            lsgd_policy::StepKind::Local
        }
    }

    fn outer_step(
        &mut self,
        _s: &State,
        _w: &lsgd_policy::Window,
        _tensors: &[lsgd_policy::TensorDrift],
    ) -> lsgd_policy::OuterStep {
        lsgd_policy::OuterStep {
            lr: f64::from(self.count),
            ..lsgd_policy::OuterStep::average()
        }
    }
}

/// A sync policy that echoes its inputs, so that every field's conversion shows in its output:
/// `plan` returns the kind numbered `window.local-steps` % 3, `outer_step` one scale per tensor
/// built from all of that tensor's fields.
#[derive(Debug)]
struct Echo;

impl Policy for Echo {
    fn info() -> Info {
        Info::new("echo", "echoes its inputs", vec![])
    }

    fn configure(_p: &Params) -> Result<Self, String> {
        Ok(Echo)
    }
}

impl lsgd_policy::SyncPolicy for Echo {
    fn plan(&self, s: &State, w: &lsgd_policy::Window) -> lsgd_policy::StepKind {
        use lsgd_policy::StepKind::*;
        assert_eq!(w.windows, s.step * 10, "the window reaches the policy");
        [Synchronous, Local, Average][(w.local_steps % 3) as usize]
    }

    fn outer_step(
        &mut self,
        s: &State,
        w: &lsgd_policy::Window,
        tensors: &[lsgd_policy::TensorDrift],
    ) -> lsgd_policy::OuterStep {
        let role = |r| match r {
            lsgd_policy::Role::Weight => 1.0,
            lsgd_policy::Role::Bias => 2.0,
            lsgd_policy::Role::BatchNorm => 3.0,
        };
        lsgd_policy::OuterStep {
            lr: s.step as f64 + f64::from(w.local_steps) / 10.0,
            momentum: w.windows as f64 / 100.0,
            nesterov: tensors.len() == 2,
            lr_scale: tensors
                .iter()
                .map(|t| {
                    role(t.role)
                        + 10.0 * (t.name.len() as f64 + t.shape.iter().sum::<u32>() as f64)
                        + 1000.0 * t.weight_norm
                        + 1e4 * t.delta_norm
                        + 1e5 * t.rank_delta_norm
                        + 1e6 * t.momentum_norm
                        + 1e7 * t.delta_dot_momentum
                })
                .collect(),
        }
    }
}

mod plateau {
    wit_bindgen::generate!({
        path: "../../wit/v0.3.0",
        world: "stateful-schedule-plugin",
        export_prefix: "plateau",
    });
    lsgd_policy::export_stateful_schedule!(lsgd_policy::plateau::Plateau);

    use super::at;
    use exports::lsgd::policy::{plugin::Guest as _, schedule::Guest as _, state::Guest as _};
    use lsgd::policy::types::{Param, ParamValue, TrainState};
    use lsgd_policy::Params;

    fn wit(s: &lsgd_policy::State) -> TrainState {
        lsgd_policy::copy_train_state!(s => TrainState)
    }

    fn configure() {
        let text = |n: &str, v: &str| Param {
            name: n.into(),
            value: ParamValue::Text(v.into()),
        };
        let params = vec![
            text("scaling", "none"),
            text("warmup", "none"),
            Param {
                name: "patience".into(),
                value: ParamValue::Integer(1),
            },
            Param {
                name: "factor".into(),
                value: ParamValue::Float(0.5),
            },
        ];
        __LsgdExport::configure(params).unwrap();
    }

    /// Ten epochs of three steps each; accuracy stalls from epoch 3.
    fn series() -> Vec<lsgd_policy::State> {
        let metric =
            |e: u32| (e > 0).then(|| [0.0, 0.3, 0.5, 0.5, 0.4, 0.5, 0.45][e.min(6) as usize]);
        (0..30)
            .map(|step| at(step, (step / 3) as u32, metric((step / 3) as u32)))
            .collect()
    }

    #[test]
    fn observes_before_each_call_and_matches_the_native_twin() {
        assert_eq!(__LsgdExport::describe().name, "plateau");
        configure();
        let given = vec![
            ("scaling".into(), lsgd_policy::Value::Text("none".into())),
            ("warmup".into(), lsgd_policy::Value::Text("none".into())),
            ("patience".into(), lsgd_policy::Value::Integer(1)),
            ("factor".into(), lsgd_policy::Value::Float(0.5)),
        ];
        let mut native = lsgd_policy::native("plateau", &Params(given))
            .unwrap()
            .unwrap();
        for s in series() {
            // The host may call more than once at a step (a retry, a consistency check).
            let lr = __LsgdExport::learning_rate(wit(&s));
            assert_eq!(__LsgdExport::learning_rate(wit(&s)).to_bits(), lr.to_bits());
            assert_eq!(lr.to_bits(), native(&s).to_bits(), "step {}", s.step);
        }
        assert!(__LsgdExport::learning_rate(wit(&at(30, 10, Some(0.1)))) < 0.1);
    }

    #[test]
    fn snapshot_restore_and_configure_reset_the_state() {
        configure();
        let all = series();
        let mut want = Vec::new();
        let mut snap = Vec::new();
        for (i, s) in all.iter().enumerate() {
            if i == 13 {
                snap = __LsgdExport::snapshot();
            }
            want.push(__LsgdExport::learning_rate(wit(s)));
        }
        configure(); // a fresh configuration starts from scratch ...
        assert_eq!(__LsgdExport::learning_rate(wit(&at(0, 0, None))), 0.1);
        __LsgdExport::restore(snap).unwrap(); // ... until the snapshot is restored
        for (i, s) in all.iter().enumerate().skip(13) {
            assert_eq!(
                __LsgdExport::learning_rate(wit(s)).to_bits(),
                want[i].to_bits(),
                "step {i}"
            );
        }
        let e = __LsgdExport::restore(vec![1, 2, 3]).unwrap_err();
        assert_eq!(e, "plateau snapshot must be 42 bytes, got 3");
    }
}

mod lars {
    wit_bindgen::generate!({
        path: "../../wit/v0.3.0",
        world: "layer-rate-plugin",
        export_prefix: "lars",
    });
    lsgd_policy::export_layer_rate!(lsgd_policy::lars::Lars);

    use super::at;
    use exports::lsgd::policy::layer_rate::{Guest as _, Role, TensorNorms};
    use exports::lsgd::policy::plugin::Guest as _;
    use lsgd_policy::Params;

    #[test]
    fn converts_every_field_and_matches_the_native_twin() {
        assert_eq!(__LsgdExport::describe().name, "lars");
        let tensor = |name: &str, role, w, g, wd| TensorNorms {
            name: name.into(),
            shape: vec![2, 3],
            role,
            weight_norm: w,
            grad_norm: g,
            update_norm: 7.0,
            weight_decay: wd,
        };
        let tensors = vec![
            tensor("conv.weight", Role::Weight, 2.0, 1.0, 0.5),
            tensor("conv.bias", Role::Bias, 2.0, 1.0, 0.0),
            tensor("bn.weight", Role::Batchnorm, 2.0, 1.0, 0.0),
            tensor("fc.weight", Role::Weight, 0.0, 1.0, 0.5),
        ];
        let native: Vec<lsgd_policy::TensorNorms> =
            tensors.iter().cloned().map(__lsgd_tensor).collect();
        assert_eq!(native[2].role, lsgd_policy::Role::BatchNorm);
        assert_eq!(
            (native[0].name.as_str(), native[0].shape.as_slice()),
            ("conv.weight", &[2, 3][..])
        );
        assert_eq!((native[0].update_norm, native[0].weight_decay), (7.0, 0.5));
        let s = at(0, 0, None);
        let got = __LsgdExport::multipliers(
            lsgd_policy::copy_train_state!(s => lsgd::policy::types::TrainState),
            tensors,
        );
        let mut twin = lsgd_policy::native_layer_rate("lars", &Params::default())
            .unwrap()
            .unwrap();
        assert_eq!(got, twin(&s, &native));
        assert_eq!(got, vec![0.001 * 2.0 / (1.0 + 0.5 * 2.0), 1.0, 1.0, 1.0]);
    }
}

/// The stateful variants of the other kinds, exercised through the same counting policy:
/// `$call` makes the kind's call on the WIT state `$s`, `$want` is its answer for count `$n`.
macro_rules! stateful_kind {
    ($module:ident, $world:literal, $export:ident, |$s:ident| $call:expr, |$n:ident| $want:expr) => {
        mod $module {
            wit_bindgen::generate!({
                path: "../../wit/v0.3.0",
                world: $world,
                export_prefix: $world,
            });
            lsgd_policy::$export!(super::Counter);

            use exports::lsgd::policy::state::Guest as _;

            #[test]
            fn observes_once_per_step_and_restores() {
                let call = |step| {
                    let $s = lsgd_policy::copy_train_state!(
                        super::at(step, 0, None) => lsgd::policy::types::TrainState
                    );
                    $call
                };
                let want = |$n: u32| $want;
                assert_eq!(call(0), want(1), "never configured: runs on its defaults");
                assert_eq!(call(0), want(1), "same step: not observed again");
                let snap = __LsgdExport::snapshot();
                call(1);
                assert_eq!(call(2), want(3));
                __LsgdExport::restore(snap).unwrap();
                assert_eq!(call(2), want(2), "restored to after step 0");
                assert_eq!(call(2), want(2));
                assert_eq!(
                    __LsgdExport::restore(vec![0]).unwrap_err(),
                    "counter snapshot of 1 bytes"
                );
            }
        }
    };
}

stateful_kind!(
    batch,
    "stateful-batch-size-plugin",
    export_stateful_batch_size,
    |s| <__LsgdExport as exports::lsgd::policy::batch_size::Guest>::global_batch(s),
    |n| n
);
stateful_kind!(
    smoothing,
    "stateful-label-smoothing-plugin",
    export_stateful_label_smoothing,
    |s| <__LsgdExport as exports::lsgd::policy::label_smoothing::Guest>::epsilon(s),
    |n| n as f32 / 100.0
);
stateful_kind!(
    layer_rate,
    "stateful-layer-rate-plugin",
    export_stateful_layer_rate,
    |s| {
        use exports::lsgd::policy::layer_rate::{Role, TensorNorms};
        let t = TensorNorms {
            name: "w".into(),
            shape: vec![1],
            role: Role::Weight,
            weight_norm: 1.0,
            grad_norm: 1.0,
            update_norm: 1.0,
            weight_decay: 0.0,
        };
        <__LsgdExport as exports::lsgd::policy::layer_rate::Guest>::multipliers(s, vec![t])
    },
    |n| vec![f64::from(n)]
);

mod warmup_v0_1 {
    wit_bindgen::generate!({
        path: "../../wit/v0.1.0",
        world: "schedule-plugin",
        export_prefix: "warmup",
    });
    lsgd_policy::export_schedule!(lsgd_policy::warmup::Warmup);

    #[test]
    fn a_0_1_guest_still_exports_through_the_same_macro() {
        use exports::lsgd::policy::schedule::Guest as _;
        let s = super::at(0, 10, None);
        let lr = __LsgdExport::learning_rate(
            lsgd_policy::copy_train_state!(s => lsgd::policy::types::TrainState),
        );
        assert_eq!(lr, 0.1);
    }
}

mod one_cycle_v0_4 {
    wit_bindgen::generate!({
        path: "../../wit/v0.4.0",
        world: "schedule-plugin",
        export_prefix: "one_cycle",
    });
    lsgd_policy::export_schedule!(lsgd_policy::one_cycle::OneCycle, momentum);

    use exports::lsgd::policy::{plugin::Guest as _, schedule::Guest as _};
    use lsgd::policy::types::{Param, ParamValue};
    use lsgd_policy::{Params, State, Value};

    #[test]
    fn exports_learning_rate_and_momentum_as_the_native_twins() {
        assert_eq!(__LsgdExport::describe().name, "one-cycle");
        __LsgdExport::configure(vec![
            Param {
                name: "three_phase".into(),
                value: ParamValue::Boolean(true),
            },
            Param {
                name: "total_steps".into(),
                value: ParamValue::Integer(40),
            },
        ])
        .unwrap();
        let given = Params(vec![
            ("three_phase".into(), Value::Boolean(true)),
            ("total_steps".into(), Value::Integer(40)),
        ]);
        let mut lr = lsgd_policy::native("one-cycle", &given).unwrap().unwrap();
        let mut momentum = lsgd_policy::native_momentum("one-cycle", &given)
            .unwrap()
            .unwrap();
        for step in 0..45 {
            let s = State {
                total_steps: 50,
                ..super::at(step, 0, None)
            };
            let wit = lsgd_policy::copy_train_state!(s => lsgd::policy::types::TrainState);
            assert_eq!(
                __LsgdExport::learning_rate(wit).to_bits(),
                lr(&s).to_bits(),
                "step {step}"
            );
            let m = __LsgdExport::momentum(wit);
            assert_eq!(m.map(f64::to_bits), momentum(&s).map(f64::to_bits));
            assert!(m.is_some_and(|m| (0.85..=0.95).contains(&m)), "step {step}");
        }
    }
}

mod stateful_v0_4 {
    wit_bindgen::generate!({
        path: "../../wit/v0.4.0",
        world: "stateful-schedule-plugin",
        export_prefix: "stateful_v0_4",
    });
    lsgd_policy::export_stateful_schedule!(super::Counter, momentum);

    use exports::lsgd::policy::{schedule::Guest as _, state::Guest as _};

    fn wit(step: u64) -> lsgd::policy::types::TrainState {
        lsgd_policy::copy_train_state!(super::at(step, 0, None) => lsgd::policy::types::TrainState)
    }

    #[test]
    fn learning_rate_observes_and_momentum_does_not() {
        assert_eq!(__LsgdExport::learning_rate(wit(0)), 1.0);
        assert_eq!(__LsgdExport::momentum(wit(0)), Some(0.01));
        // A momentum call at a new step sees what learning-rate last observed, nothing more.
        assert_eq!(__LsgdExport::momentum(wit(1)), Some(0.01));
        assert_eq!(__LsgdExport::learning_rate(wit(1)), 2.0);
        assert_eq!(__LsgdExport::momentum(wit(1)), Some(0.02));
        let snap = __LsgdExport::snapshot();
        assert_eq!(__LsgdExport::learning_rate(wit(2)), 3.0);
        __LsgdExport::restore(snap).unwrap();
        assert_eq!(__LsgdExport::momentum(wit(2)), Some(0.02));
    }
}

mod echo_sync_v0_5 {
    wit_bindgen::generate!({
        path: "../../wit/v0.5.0",
        world: "sync-plugin",
        export_prefix: "echo_sync",
    });
    lsgd_policy::export_sync!(super::Echo);

    use exports::lsgd::policy::plugin::Guest as _;
    use exports::lsgd::policy::sync::{Guest as _, Role, StepKind, TensorDrift, Window};

    fn wit(step: u64) -> lsgd::policy::types::TrainState {
        lsgd_policy::copy_train_state!(super::at(step, 0, None) => lsgd::policy::types::TrainState)
    }

    #[test]
    fn converts_every_field() {
        assert_eq!(__LsgdExport::describe().name, "echo");
        let window = |local_steps, step: u64| Window {
            local_steps,
            windows: step * 10,
        };
        assert_eq!(
            __LsgdExport::plan(wit(2), window(0, 2)),
            StepKind::Synchronous
        );
        assert_eq!(__LsgdExport::plan(wit(2), window(4, 2)), StepKind::Local);
        assert_eq!(__LsgdExport::plan(wit(3), window(5, 3)), StepKind::Average);
        let tensor = |name: &str, role, shape: Vec<u32>, k: f64| TensorDrift {
            name: name.into(),
            shape,
            role,
            weight_norm: k,
            delta_norm: k,
            rank_delta_norm: k,
            momentum_norm: k,
            delta_dot_momentum: k,
        };
        let o = __LsgdExport::outer_step(
            wit(7),
            Window {
                local_steps: 3,
                windows: 42,
            },
            vec![
                tensor("fc.w", Role::Weight, vec![2, 3], 1.0),
                tensor("bn", Role::Batchnorm, vec![5], 0.0),
            ],
        );
        assert_eq!((o.lr, o.momentum, o.nesterov), (7.3, 0.42, true));
        assert_eq!(o.lr_scale, vec![1.0 + 90.0 + 11_111_000.0, 3.0 + 70.0]);
        let bias = __LsgdExport::outer_step(
            wit(0),
            Window {
                local_steps: 0,
                windows: 0,
            },
            vec![tensor("b", Role::Bias, vec![], 0.0)],
        );
        assert_eq!((bias.nesterov, bias.lr_scale), (false, vec![2.0 + 10.0]));
    }
}

mod local_sgd_v0_5 {
    wit_bindgen::generate!({
        path: "../../wit/v0.5.0",
        world: "sync-plugin",
        export_prefix: "local_sgd",
    });
    lsgd_policy::export_sync!(lsgd_policy::local_sgd::LocalSgd);

    use exports::lsgd::policy::plugin::Guest as _;
    use exports::lsgd::policy::sync::{Guest as _, StepKind, Window};
    use lsgd::policy::types::{Param, ParamValue};
    use lsgd_policy::{Params, Value};

    /// The WIT case's name, as `lsgd_policy::StepKind::name` writes it.
    fn name(k: StepKind) -> &'static str {
        match k {
            StepKind::Synchronous => "synchronous",
            StepKind::Local => "local",
            StepKind::Average => "average",
        }
    }

    #[test]
    fn plans_and_outer_steps_as_the_native_twin() {
        assert_eq!(__LsgdExport::describe().name, "local-sgd");
        __LsgdExport::configure(vec![Param {
            name: "period".into(),
            value: ParamValue::Integer(3),
        }])
        .unwrap();
        let given = Params(vec![("period".into(), Value::Integer(3))]);
        let mut twin = lsgd_policy::native_sync("local-sgd", &given)
            .unwrap()
            .unwrap();
        let mut w = lsgd_policy::Window::default();
        let mut kinds = String::new();
        for step in 0..9 {
            let s = super::at(step, 0, None);
            let ws = lsgd_policy::copy_train_state!(s => lsgd::policy::types::TrainState);
            let ww = Window {
                local_steps: w.local_steps,
                windows: w.windows,
            };
            let kind = __LsgdExport::plan(ws, ww);
            let want = twin.plan(&s, &w);
            assert_eq!(name(kind), want.name(), "step {step}");
            if kind == StepKind::Average {
                let o = __LsgdExport::outer_step(ws, ww, vec![]);
                assert_eq!((o.lr, o.momentum, o.nesterov), (1.0, 0.0, false));
                assert!(o.lr_scale.is_empty());
            }
            kinds.push(want.name().as_bytes()[0] as char);
            w = w.after(want);
        }
        assert_eq!(kinds, "llallalla");
        let e = __LsgdExport::configure(vec![Param {
            name: "period".into(),
            value: ParamValue::Integer(0),
        }])
        .unwrap_err();
        assert_eq!(e, "period must be in [1, 4294967295], got 0");
    }
}

mod adaptive_period_v0_5 {
    wit_bindgen::generate!({
        path: "../../wit/v0.5.0",
        world: "stateful-sync-plugin",
        export_prefix: "adaptive_period",
    });
    lsgd_policy::export_stateful_sync!(lsgd_policy::adaptive_period::AdaptivePeriod);

    use exports::lsgd::policy::plugin::Guest as _;
    use exports::lsgd::policy::state::Guest as _;
    use exports::lsgd::policy::sync::{Guest as _, Role, StepKind, TensorDrift, Window};
    use lsgd::policy::types::{Param, ParamValue};
    use lsgd_policy::{Params, State, Value};

    /// The WIT case's name, as `lsgd_policy::StepKind::name` writes it.
    fn name(k: StepKind) -> &'static str {
        match k {
            StepKind::Synchronous => "synchronous",
            StepKind::Local => "local",
            StepKind::Average => "average",
        }
    }

    /// A window's end on 2 ranks whose drifts have agreement `rho`.
    fn drift(rho: f64) -> TensorDrift {
        TensorDrift {
            name: "w".into(),
            shape: vec![3],
            role: Role::Weight,
            weight_norm: 1.0,
            delta_norm: ((1.0 + rho) / 2.0).sqrt(),
            rank_delta_norm: 1.0,
            momentum_norm: 0.0,
            delta_dot_momentum: 0.0,
        }
    }

    /// Drives the plugin and the native twin from `pos` through one window per entry of `rho`,
    /// checking that they agree at every call; returns every step's kind.
    fn drive(
        twin: &mut lsgd_policy::NativeSync,
        pos: &mut (u64, lsgd_policy::Window),
        rho: &[f64],
    ) -> Vec<lsgd_policy::StepKind> {
        let mut kinds = Vec::new();
        let mut left = rho;
        while let Some(&r) = left.first() {
            let (step, w) = *pos;
            let s = State {
                world_size: 2,
                ..super::at(step, 0, None)
            };
            let ws = lsgd_policy::copy_train_state!(s => lsgd::policy::types::TrainState);
            let ww = Window {
                local_steps: w.local_steps,
                windows: w.windows,
            };
            // The host may ask twice at one step (a retry): observing is idempotent.
            let kind = __LsgdExport::plan(ws, ww);
            assert_eq!(__LsgdExport::plan(ws, ww), kind);
            let want = twin.plan(&s, &w);
            assert_eq!(name(kind), want.name(), "step {step}");
            if kind == StepKind::Average {
                let tensors = vec![drift(r)];
                let native: Vec<lsgd_policy::TensorDrift> =
                    tensors.iter().cloned().map(__lsgd_drift).collect();
                let o = __LsgdExport::outer_step(ws, ww, tensors);
                let n = twin.outer_step(&s, &w, &native);
                assert_eq!(
                    (o.lr, o.momentum, o.nesterov),
                    (n.lr, n.momentum, n.nesterov)
                );
                left = &left[1..];
            }
            assert_eq!(
                Some(__LsgdExport::snapshot()),
                twin.snapshot(),
                "step {step}"
            );
            kinds.push(want);
            *pos = (step + 1, w.after(want));
        }
        kinds
    }

    fn params() -> (Vec<Param>, Params) {
        let wit = vec![
            Param {
                name: "period".into(),
                value: ParamValue::Integer(2),
            },
            Param {
                name: "outer_lr".into(),
                value: ParamValue::Float(0.7),
            },
        ];
        let native = Params(vec![
            ("period".into(), Value::Integer(2)),
            ("outer_lr".into(), Value::Float(0.7)),
        ]);
        (wit, native)
    }

    #[test]
    fn adapts_as_the_native_twin_and_resumes_from_a_snapshot() {
        assert_eq!(__LsgdExport::describe().name, "adaptive-period");
        let (wit, native) = params();
        __LsgdExport::configure(wit.clone()).unwrap();
        let mut twin = lsgd_policy::native_sync("adaptive-period", &native)
            .unwrap()
            .unwrap();
        let rho = [0.9, 0.9, 0.2, 0.6, 0.9];
        let mut pos = (0, lsgd_policy::Window::default());
        let head = drive(&mut twin, &mut pos, &rho[..2]);
        assert_eq!(head.len(), 2 + 4, "windows of 2, then 4 steps");
        let snap = __LsgdExport::snapshot();
        let at_snapshot = pos;
        let tail = drive(&mut twin, &mut pos, &rho[2..]);
        assert_eq!(tail.len(), 8 + 4 + 4);

        // A fresh configuration starts over; restoring continues where the snapshot was.
        __LsgdExport::configure(wit).unwrap();
        let mut fresh = lsgd_policy::native_sync("adaptive-period", &native)
            .unwrap()
            .unwrap();
        assert_ne!(Some(__LsgdExport::snapshot()), Some(snap.clone()));
        __LsgdExport::restore(snap.clone()).unwrap();
        fresh.restore(&snap).unwrap();
        let mut pos = at_snapshot;
        assert_eq!(drive(&mut fresh, &mut pos, &rho[2..]), tail);

        let e = __LsgdExport::restore(vec![1, 2, 3]).unwrap_err();
        assert_eq!(e, "adaptive-period snapshot must be 14 bytes, got 3");
    }
}

mod counter_sync_v0_5 {
    wit_bindgen::generate!({
        path: "../../wit/v0.5.0",
        world: "stateful-sync-plugin",
        export_prefix: "counter_sync",
    });
    lsgd_policy::export_stateful_sync!(super::Counter);

    use exports::lsgd::policy::state::Guest as _;
    use exports::lsgd::policy::sync::{Guest as _, StepKind, Window};

    fn wit(step: u64) -> lsgd::policy::types::TrainState {
        lsgd_policy::copy_train_state!(super::at(step, 0, None) => lsgd::policy::types::TrainState)
    }

    #[test]
    fn plan_observes_and_outer_step_does_not() {
        let w = Window {
            local_steps: 0,
            windows: 0,
        };
        assert_eq!(__LsgdExport::plan(wit(0), w), StepKind::Average, "count 1");
        assert_eq!(__LsgdExport::outer_step(wit(0), w, vec![]).lr, 1.0);
        // An outer step at a new step sees what plan last observed, nothing more.
        assert_eq!(__LsgdExport::outer_step(wit(1), w, vec![]).lr, 1.0);
        assert_eq!(__LsgdExport::plan(wit(1), w), StepKind::Local, "count 2");
        let snap = __LsgdExport::snapshot();
        assert_eq!(__LsgdExport::plan(wit(2), w), StepKind::Average);
        __LsgdExport::restore(snap).unwrap();
        assert_eq!(__LsgdExport::outer_step(wit(2), w, vec![]).lr, 2.0);
    }
}
