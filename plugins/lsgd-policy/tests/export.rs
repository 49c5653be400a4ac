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
