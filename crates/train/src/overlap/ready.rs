//! Gradient-ready hooks: a callback once autograd has accumulated a parameter's gradient, from
//! libtorch's side (`ready.cpp`: a post hook on each parameter's gradient accumulator, as DDP's
//! reducer registers; tch has no autograd hooks). The hooks work for any leaf tensor that
//! requires grad, so the built-in models and TorchScript models alike.

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use tch::Tensor;

use crate::model::script::check;

/// What the hooks report to: called on autograd's thread (the caller's thread for a CPU
/// backward pass, a device thread for CUDA) with the index of the tensor whose gradient is
/// ready. It must not panic (it runs inside libtorch, behind a C ABI).
pub trait Readiness: Send + Sync {
    /// Tensor `index` (its position in the slice given to [`GradReady::register`]) has its
    /// gradient for this backward pass.
    fn ready(&self, index: usize);
}

/// The order in which gradients became ready, for a test or for a first step that records it.
#[derive(Debug, Default)]
pub struct Order(Mutex<Vec<usize>>);

impl Order {
    /// The indices reported since the last call, in order.
    pub fn take(&self) -> Vec<usize> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Readiness for Order {
    fn ready(&self, index: usize) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(index);
    }
}

type ReadyFn = extern "C" fn(*mut c_void, usize);

unsafe extern "C" {
    fn lsgd_ready_register(
        tensors: *const *mut c_void,
        n: usize,
        ready: ReadyFn,
        ctx: *mut c_void,
        out: *mut *mut c_void,
    ) -> *mut std::ffi::c_char;
    fn lsgd_ready_reached(
        handle: *mut c_void,
        loss: *mut c_void,
        out: *mut u8,
    ) -> *mut std::ffi::c_char;
    fn lsgd_ready_forget(tensors: *const *mut c_void, n: usize) -> *mut std::ffi::c_char;
    fn lsgd_ready_free(handle: *mut c_void);
}

/// Leaves each of `tensors` without a gradient, as before any backward pass (a gradient
/// zeroed in place still counts as one for the optimizer and the search for unused
/// parameters).
pub fn forget_grads(tensors: &[&Tensor]) {
    let ptrs: Vec<*mut c_void> = tensors
        .iter()
        .map(|t| t.as_ptr().cast_mut().cast())
        .collect();
    // SAFETY: the tensors outlive the call.
    let reset = check(unsafe { lsgd_ready_forget(ptrs.as_ptr(), ptrs.len()) });
    // Resetting an optional tensor cannot throw; a failure here is a broken libtorch.
    reset.expect("libtorch could not reset a gradient");
}

extern "C" fn on_ready(ctx: *mut c_void, index: usize) {
    // SAFETY: `ctx` is the `Box<Arc<dyn Readiness>>` a live `GradReady` owns (its hooks are
    // removed before it is freed).
    let target = unsafe { &*ctx.cast::<Arc<dyn Readiness>>() };
    // A panic must not unwind into libtorch.
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| target.ready(index))).is_err() {
        eprintln!("lsgd-train: a gradient-ready callback panicked (tensor {index})");
    }
}

/// Hooks on a set of parameters; dropping it removes them.
pub struct GradReady {
    handle: NonNull<c_void>,
    len: usize,
    // Boxed so that its address, which the hooks hold, does not move.
    target: Box<Arc<dyn Readiness>>,
}

// SAFETY: the handle owns libtorch nodes (reference counted, thread-safe) and the hooks' keys;
// removing the hooks from another thread than the one that added them is what libtorch allows
// for any node outside a running backward pass.
unsafe impl Send for GradReady {}

impl GradReady {
    /// Registers a hook on each of `tensors` (leaves that require grad: a model's trainable
    /// parameters) that reports to `target` once its gradient is accumulated.
    pub fn register(tensors: &[Tensor], target: Arc<dyn Readiness>) -> Result<GradReady, String> {
        let ptrs: Vec<*mut c_void> = tensors
            .iter()
            .map(|t| t.as_ptr().cast_mut().cast())
            .collect();
        let target = Box::new(target);
        let ctx: *const Arc<dyn Readiness> = &*target;
        let mut out = std::ptr::null_mut();
        // SAFETY: the tensors outlive the call; `ctx` stays valid while the hooks exist (see
        // Drop); `out` is written on success only.
        check(unsafe {
            lsgd_ready_register(
                ptrs.as_ptr(),
                ptrs.len(),
                on_ready,
                ctx.cast_mut().cast(),
                &mut out,
            )
        })?;
        let handle = NonNull::new(out).ok_or("libtorch returned no hooks")?;
        Ok(GradReady {
            handle,
            len: tensors.len(),
            target,
        })
    }

    /// What the hooks report to.
    pub fn target(&self) -> &Arc<dyn Readiness> {
        &self.target
    }

    /// Which of the hooked tensors the autograd graph behind `loss` reaches: those whose
    /// hooks its backward pass will call (a tensor it does not reach gets no gradient from it).
    pub fn reached(&self, loss: &Tensor) -> Result<Vec<bool>, String> {
        // The handle's own count: one flag per hooked tensor.
        let mut out = vec![0u8; self.len];
        // SAFETY: the handle is live; `loss` outlives the call; `out` has one byte per hook.
        check(unsafe {
            lsgd_ready_reached(
                self.handle.as_ptr(),
                loss.as_ptr().cast_mut().cast(),
                out.as_mut_ptr(),
            )
        })?;
        Ok(out.into_iter().map(|b| b != 0).collect())
    }
}

impl Drop for GradReady {
    fn drop(&mut self) {
        // SAFETY: the handle came from lsgd_ready_register and is freed once, before `target`.
        unsafe { lsgd_ready_free(self.handle.as_ptr()) }
    }
}

#[cfg(test)]
mod tests {
    use tch::nn::{self, Module, OptimizerConfig};
    use tch::{Device, Kind};

    use super::*;

    /// An mlp's parameters in creation order, and a loss over a small batch.
    fn mlp() -> (nn::VarStore, nn::Sequential) {
        let vs = nn::VarStore::new(Device::Cpu);
        let root = vs.root();
        let net = nn::seq()
            .add(nn::linear(&root / "l1", 6, 5, Default::default()))
            .add_fn(|x| x.relu())
            .add(nn::linear(&root / "l2", 5, 4, Default::default()))
            .add_fn(|x| x.relu())
            .add(nn::linear(&root / "l3", 4, 3, Default::default()));
        (vs, net)
    }

    fn names_in_order(vs: &nn::VarStore) -> Vec<(String, Tensor)> {
        let mut named: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
        named.sort_by(|a, b| a.0.cmp(&b.0));
        named
    }

    #[test]
    fn each_gradient_reports_once_after_it_is_accumulated_last_layer_first() {
        tch::manual_seed(0);
        let (vs, net) = mlp();
        let named = names_in_order(&vs);
        let tensors: Vec<Tensor> = named.iter().map(|(_, t)| t.shallow_clone()).collect();
        // The hook checks that `.grad` already holds the gradient when it fires.
        struct Seen {
            tensors: Mutex<Vec<Tensor>>,
            order: Order,
            defined: Mutex<Vec<bool>>,
        }
        impl Readiness for Seen {
            fn ready(&self, index: usize) {
                self.order.ready(index);
                let g = self.tensors.lock().unwrap()[index].grad();
                let ok = g.defined() && g.abs().sum(Kind::Double).double_value(&[]) > 0.0;
                self.defined.lock().unwrap().push(ok);
            }
        }
        let seen = Arc::new(Seen {
            tensors: Mutex::new(tensors.iter().map(|t| t.shallow_clone()).collect()),
            order: Order::default(),
            defined: Mutex::new(Vec::new()),
        });
        let hooks = GradReady::register(&tensors, seen.clone()).unwrap();
        let xs = Tensor::randn([8, 6], (Kind::Float, Device::Cpu));
        for pass in 0..2 {
            net.forward(&xs).square().sum(Kind::Float).backward();
            let order = seen.order.take();
            let names: Vec<&str> = order.iter().map(|&i| named[i].0.as_str()).collect();
            // Every parameter once; the last layer's before the first's (autograd's order).
            assert_eq!(order.len(), tensors.len(), "pass {pass}: {names:?}");
            let layer = |n: &str| n.split('.').next().unwrap().to_string();
            let first_l3 = names.iter().position(|n| layer(n) == "l3").unwrap();
            let first_l1 = names.iter().position(|n| layer(n) == "l1").unwrap();
            assert!(first_l3 < first_l1, "pass {pass}: {names:?}");
        }
        assert!(seen.defined.lock().unwrap().iter().all(|&ok| ok));
        // Dropped: no more reports, and training goes on.
        drop(hooks);
        let mut opt = nn::Sgd::default().build(&vs, 0.1).unwrap();
        opt.backward_step(&net.forward(&xs).square().sum(Kind::Float));
        assert!(seen.order.take().is_empty());
    }

    #[test]
    fn the_graph_walk_finds_the_tensors_a_loss_reaches_and_forgotten_gradients_are_none() {
        let used = Tensor::ones([2], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let head = Tensor::ones([2], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let tensors = [used.shallow_clone(), head.shallow_clone()];
        let hooks = GradReady::register(&tensors, Arc::new(Order::default())).unwrap();
        let loss = (&used * 3.0).sum(Kind::Float);
        assert_eq!(hooks.reached(&loss).unwrap(), [true, false]);
        loss.backward();
        assert!(used.grad().defined());
        forget_grads(&[&used]);
        assert!(!used.grad().defined());
        // A loss with no graph reaches nothing.
        let constant = Tensor::zeros([], (Kind::Float, Device::Cpu));
        assert_eq!(hooks.reached(&constant).unwrap(), [false, false]);
    }

    #[test]
    fn a_tensor_without_a_gradient_is_refused_by_index() {
        let frozen = Tensor::zeros([3], (Kind::Float, Device::Cpu));
        let err = GradReady::register(&[frozen], Arc::new(Order::default()))
            .err()
            .unwrap();
        assert!(
            err.contains("tensor 0 is not a leaf that requires grad"),
            "{err}"
        );
    }
}
