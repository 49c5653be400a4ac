//! Waiting in the sandbox takes no time and never blocks the host.
//!
//! wasmtime-wasi serves a guest's `std::thread::sleep` (or wasi-libc's `poll`, `nanosleep`) by
//! subscribing to the monotonic clock and blocking the host thread in `wasi:io/poll` until the
//! real time has passed. Inside a host call neither fuel nor the epoch deadline is checked, so
//! a plugin that slept held its rank for as long as it liked, forever included. The sandbox's
//! clock stands still ([`super::sandbox`]'s fixed clock), so its waits are served consistently
//! with it: a wait on the clock is over as soon as it starts (a sleep returns at once and the
//! clock still reads what it read before), and a guest that waits for the clock to move loops,
//! spending fuel, until its budget or the deadline stops it like any other loop.
//!
//! `wasi:io/poll` is served without blocking too: it answers with what is ready now, and a wait
//! on something that is not ready traps instead of blocking. Nothing in the sandbox stays
//! unready (stdin is closed, stdout and stderr take any write, there are no files or sockets),
//! so that refusal only stands guard should the sandbox ever gain something to wait on. The
//! streams' blocking calls (`blocking-read`, `blocking-flush` ...) wait on their stream's
//! readiness, which is immediate for the same reason.

use std::pin::pin;

use wasmtime::component::{HasData, Linker, Resource, ResourceTable};
use wasmtime_wasi::clocks::{WasiClocksCtxView, WasiClocksView};
use wasmtime_wasi::p2::bindings::clocks::monotonic_clock;
use wasmtime_wasi::p2::bindings::io::poll as async_poll;
use wasmtime_wasi::p2::bindings::sync::io::poll;
use wasmtime_wasi::p2::{DynPollable, Pollable, subscribe};
use wasmtime_wasi::runtime::{poll_noop, with_ambient_tokio_runtime};

use super::sandbox::Sandbox;

/// Serves `wasi:clocks/monotonic-clock` and `wasi:io/poll` in `linker` with the waits of this
/// module, in place of the blocking ones `wasmtime_wasi::p2::add_to_linker_sync` put there.
pub(super) fn link(linker: &mut Linker<Sandbox>) -> wasmtime::Result<()> {
    // Shadowing redefines the two interfaces' functions one by one; every other interface keeps
    // wasmtime-wasi's definitions.
    linker.allow_shadowing(true);
    monotonic_clock::add_to_linker::<Sandbox, NoWaiting>(linker, waits)?;
    poll::add_to_linker::<Sandbox, NoWaiting>(linker, waits)?;
    linker.allow_shadowing(false);
    Ok(())
}

/// The [`HasData`] of the interfaces [`link`] serves.
struct NoWaiting;

impl HasData for NoWaiting {
    type Data<'a> = Waits<'a>;
}

/// The clocks and the resource table of one store, as [`link`]'s interfaces see them.
struct Waits<'a>(WasiClocksCtxView<'a>);

/// The [`Waits`] of a store's sandbox.
fn waits(sandbox: &mut Sandbox) -> Waits<'_> {
    Waits(sandbox.clocks())
}

/// A subscription to the clock: the clock never moves, so whatever time was asked for has
/// passed as far as the guest can tell.
struct Elapsed;

#[wasmtime_wasi::async_trait]
impl Pollable for Elapsed {
    async fn ready(&mut self) {}
}

impl Waits<'_> {
    fn elapsed(&mut self) -> wasmtime::Result<Resource<DynPollable>> {
        let elapsed = self.0.table.push(Elapsed)?;
        subscribe(self.0.table, elapsed)
    }

    fn table(&mut self) -> &mut ResourceTable {
        self.0.table
    }
}

impl monotonic_clock::Host for Waits<'_> {
    fn now(&mut self) -> wasmtime::Result<monotonic_clock::Instant> {
        monotonic_clock::Host::now(&mut self.0)
    }

    fn resolution(&mut self) -> wasmtime::Result<monotonic_clock::Duration> {
        monotonic_clock::Host::resolution(&mut self.0)
    }

    fn subscribe_instant(
        &mut self,
        _when: monotonic_clock::Instant,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        self.elapsed()
    }

    fn subscribe_duration(
        &mut self,
        _duration: monotonic_clock::Duration,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        self.elapsed()
    }
}

impl poll::Host for Waits<'_> {
    fn poll(&mut self, pollables: Vec<Resource<DynPollable>>) -> wasmtime::Result<Vec<u32>> {
        now_or_never(async_poll::Host::poll(self.table(), pollables))
            .unwrap_or_else(|| Err(never_ready("poll")))
    }
}

impl poll::HostPollable for Waits<'_> {
    fn ready(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<bool> {
        // wasmtime-wasi's `ready` does not wait; it only needs the ambient runtime.
        now_or_never(async_poll::HostPollable::ready(self.table(), pollable))
            .unwrap_or_else(|| Err(never_ready("pollable.ready")))
    }

    fn block(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<()> {
        now_or_never(async_poll::HostPollable::block(self.table(), pollable))
            .unwrap_or_else(|| Err(never_ready("pollable.block")))
    }

    fn drop(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<()> {
        async_poll::HostPollable::drop(self.table(), pollable)
    }
}

/// The output of `future` if it has one at its first poll; the pollables of wasmtime-wasi may
/// look for a Tokio runtime, so it is polled inside wasmtime-wasi's.
fn now_or_never<F: Future>(future: F) -> Option<F::Output> {
    with_ambient_tokio_runtime(|| poll_noop(pin!(future)))
}

/// The trap of a wait on something that is not ready, in place of blocking the host thread.
fn never_ready(call: &str) -> wasmtime::Error {
    wasmtime::format_err!(
        "the plugin waited in wasi:io/{call} on something that is not ready, and nothing in the \
         sandbox becomes ready later (no input, files or network), so it would wait forever"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::sandbox::Limits;
    use poll::{Host as _, HostPollable as _};

    /// What a socket with nothing to read would be: a pollable that is never ready.
    struct Never;

    #[wasmtime_wasi::async_trait]
    impl Pollable for Never {
        async fn ready(&mut self) {
            std::future::pending::<()>().await
        }
    }

    #[test]
    fn a_wait_on_the_clock_is_over_at_once_and_one_on_anything_else_traps() {
        let mut sandbox = Sandbox::new(&Limits::default());
        let mut w = waits(&mut sandbox);
        let now = monotonic_clock::Host::now(&mut w).unwrap();
        let forever = monotonic_clock::Host::subscribe_duration(&mut w, u64::MAX).unwrap();
        let later = monotonic_clock::Host::subscribe_instant(&mut w, now + 1).unwrap();
        let never = w.table().push(Never).unwrap();
        let never = subscribe(w.table(), never).unwrap();
        let handle = |p: &Resource<DynPollable>| Resource::<DynPollable>::new_borrow(p.rep());
        assert_eq!(
            w.poll(vec![handle(&never), handle(&forever), handle(&later)])
                .unwrap(),
            [1, 2]
        );
        w.block(handle(&forever)).unwrap();
        assert!(w.ready(handle(&later)).unwrap());
        assert!(!w.ready(handle(&never)).unwrap());
        for e in [
            w.poll(vec![handle(&never)]).unwrap_err(),
            w.block(handle(&never)).unwrap_err(),
        ] {
            assert!(e.to_string().contains("would wait forever"), "{e}");
        }
        assert_eq!(monotonic_clock::Host::now(&mut w).unwrap(), now);
        for p in [never, forever, later] {
            w.drop(p).unwrap();
        }
    }
}
