//! `post-local-sgd`: post-local SGD (Lin et al. 2018): synchronous data parallelism for the
//! first `warmup_steps` steps, local SGD after them. Exactly PyTorch's `PostLocalSGDState(
//! start_localSGD_iter=W)` DDP communication hook with `PeriodicModelAverager(period=H,
//! warmup_steps=W)`.

use crate::sync::{period, period_spec};
use crate::util::count;
use crate::{
    Info, OuterStep, ParamSpec, Params, Policy, State, StepKind, SyncPolicy, TensorDrift, Window,
};

/// Synchronous before step W = `warmup_steps`; from W on local, averaging after steps W,
/// W + H, W + 2H ... (H = `period`), as torch's averager does after optimizer step s when
/// s >= W and (s − W) % H == 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PostLocalSgd {
    /// W: the steps taken synchronously before local SGD starts.
    pub warmup_steps: u64,
    /// H: the steps between two averages once local SGD has started.
    pub period: u32,
}

impl Policy for PostLocalSgd {
    fn info() -> Info {
        Info::new(
            "post-local-sgd",
            "Post-local SGD (torch's PostLocalSGDState + PeriodicModelAverager): synchronous for \
             `warmup_steps` steps, then local steps averaged every `period`",
            vec![
                ParamSpec::integer(
                    "warmup_steps",
                    100,
                    "W: steps taken synchronously before local SGD starts (>= 0)",
                ),
                period_spec(
                    4,
                    "H: from step W on, the ranks average after steps W, W+H, W+2H ... (>= 1)",
                ),
            ],
        )
    }

    fn configure(p: &Params) -> Result<Self, String> {
        Ok(PostLocalSgd {
            warmup_steps: count(p, "warmup_steps")?,
            period: period(p, "period")?,
        })
    }
}

impl SyncPolicy for PostLocalSgd {
    fn plan(&self, s: &State, w: &Window) -> StepKind {
        if s.step < self.warmup_steps {
            // Synchronous is only allowed at a window's start; a window that has somehow begun
            // (a host that resumed into the warm-up from elsewhere) must end with an average.
            return if w.local_steps == 0 {
                StepKind::Synchronous
            } else {
                StepKind::Average
            };
        }
        if (s.step - self.warmup_steps).is_multiple_of(u64::from(self.period)) {
            StepKind::Average
        } else {
            StepKind::Local
        }
    }

    fn outer_step(&mut self, _s: &State, _w: &Window, _tensors: &[TensorDrift]) -> OuterStep {
        OuterStep::average()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Value;
    use crate::sync::testing::{at, drift, plan_letters};
    use crate::testing::{configure, error};

    fn with(w: i64, h: i64) -> PostLocalSgd {
        configure(&[
            ("warmup_steps", Value::Integer(w)),
            ("period", Value::Integer(h)),
        ])
        .unwrap()
    }

    #[test]
    fn synchronous_then_periodic() {
        assert_eq!(plan_letters(&with(2, 3), 11), "SSALLALLALL");
        assert_eq!(plan_letters(&with(0, 4), 9), "ALLLALLLA");
        assert_eq!(plan_letters(&with(3, 1), 6), "SSSAAA");
        let d: PostLocalSgd = configure(&[]).unwrap();
        assert_eq!((d.warmup_steps, d.period), (100, 4));
        let seq = plan_letters(&d, 109);
        assert_eq!(&seq[..100], "S".repeat(100));
        assert_eq!(&seq[100..], "ALLLALLLA");
    }

    #[test]
    fn torch_post_local_sgd() {
        // The hook all-reduces gradients while its iteration < start_localSGD_iter; the
        // averager averages after step s when s >= warmup_steps and (s - warmup_steps) % H == 0.
        for (w, h) in [(0u64, 1u32), (0, 4), (5, 2), (100, 4), (7, 16)] {
            let p = PostLocalSgd {
                warmup_steps: w,
                period: h,
            };
            let mut win = Window::default();
            for s in 0..300 {
                let want = if s < w {
                    StepKind::Synchronous
                } else if (s - w) % u64::from(h) == 0 {
                    StepKind::Average
                } else {
                    StepKind::Local
                };
                let got = p.plan(&at(s, 1000), &win);
                assert_eq!(got, want, "W={w} H={h} step {s}");
                win = win.after(got);
            }
        }
    }

    #[test]
    fn never_synchronous_inside_a_window() {
        let p = with(10, 4);
        let inside = Window {
            local_steps: 2,
            windows: 0,
        };
        assert_eq!(p.plan(&at(5, 100), &inside), StepKind::Average);
        assert_eq!(
            p.plan(&at(5, 100), &Window::default()),
            StepKind::Synchronous
        );
    }

    #[test]
    fn the_outer_step_is_plain_averaging() {
        let mut p = with(2, 3);
        let o = p.outer_step(&at(2, 100), &Window::default(), &[drift(1.0, 1.0)]);
        assert_eq!(o, OuterStep::average());
    }

    #[test]
    fn configure_errors() {
        assert_eq!(
            error::<PostLocalSgd>(&[("warmup_steps", Value::Integer(-1))]),
            "warmup_steps must be >= 0, got -1"
        );
        assert_eq!(
            error::<PostLocalSgd>(&[("period", Value::Integer(0))]),
            "period must be in [1, 4294967295], got 0"
        );
    }
}
