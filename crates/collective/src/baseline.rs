//! MPI_Allreduce, the baseline every other algorithm is measured against, started as
//! MPI_Iallreduce so that the rank waits for it as for every other algorithm (`wait`). Not
//! under ULFM (`--fault-tolerance`): there Open MPI's nonblocking collectives (libnbc) abort
//! their schedule on a lost rank (error 75) instead of reporting the failure as the blocking
//! MPI_Allreduce does on every survivor, which left the survivors disagreeing on who was lost
//! (the lab's grow-back test); so a tolerant world calls MPI_Allreduce.
//!
//! rsmpi 0.8.2 has no `MPI_IN_PLACE`, so the input is copied to a scratch buffer first (a
//! memcpy, small next to the reduction itself).
//!
//! MPI has no 16-bit float sum, so the 16-bit formats reduce with a user-defined operation
//! (`MPI_Op_create`) over MPI_UINT16_T: the wire still carries 2 bytes per element and MPI keeps
//! choosing its own algorithm. The host builds rsmpi without libffi, hence the function-pointer
//! [`UnsafeUserOperation`] rather than a closure. The operation is declared commutative (an
//! IEEE sum is, bit for bit), which leaves MPI free to pick the same algorithms as for MPI_SUM.

use std::ffi::{c_int, c_void};

use mpi::collective::{SystemOperation, UnsafeUserOperation};
use mpi::ffi::MPI_Datatype;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use super::chunks::Format;
use super::wait::finish;

/// In-place MPI_Allreduce (sum) over `comm`, blocking when `tolerant` (see the module).
/// Returns the bandwidth lower bound of bytes sent, 2((p−1)/p)·n elements, since MPI does not
/// say what it sent.
pub fn all_reduce<E: Format>(
    comm: &SimpleCommunicator,
    buf: &mut [E::Stored],
    scratch: &mut Vec<E::Stored>,
    tolerant: bool,
) -> u64 {
    let p = comm.size() as u64;
    scratch.clear();
    scratch.extend_from_slice(buf);
    if E::MPI_SUM {
        reduce(comm, &scratch[..], buf, SystemOperation::sum(), tolerant);
    } else {
        // SAFETY: `sum::<E>` reads and writes `len` values of `E::Stored`, the element type of
        // both buffers of this one call, and cannot panic.
        let op = unsafe { UnsafeUserOperation::commutative(sum::<E>) };
        reduce(comm, &scratch[..], buf, &op, tolerant);
    }
    2 * (p - 1) * size_of_val(buf) as u64 / p
}

/// `recv` = the sum over `comm` of every rank's `send` under `op`: nonblocking and finished
/// by `wait::finish`, or MPI_Allreduce when `blocking`.
fn reduce<T: Equivalence, O: Operation>(
    comm: &SimpleCommunicator,
    send: &[T],
    recv: &mut [T],
    op: O,
    blocking: bool,
) {
    if blocking {
        comm.all_reduce_into(send, recv, op);
    } else {
        mpi::request::scope(|scope| {
            finish(comm.immediate_all_reduce_into(scope, send, recv, op));
        });
    }
}

/// The MPI user function: `inout[i] = in[i] + inout[i]` in format `E`.
///
/// # Safety
/// `invec` and `inoutvec` must point to `*len` valid, aligned, non-overlapping `E::Stored`.
unsafe extern "C" fn sum<E: Format>(
    invec: *mut c_void,
    inoutvec: *mut c_void,
    len: *mut c_int,
    _datatype: *mut MPI_Datatype,
) {
    // SAFETY: MPI passes the element count of the two buffers, as the caller guarantees.
    let n = usize::try_from(unsafe { *len }).unwrap_or(0);
    if n == 0 {
        return;
    }
    // SAFETY: see the function's contract; MPI never aliases its input and output vectors.
    let (inc, acc) = unsafe {
        (
            std::slice::from_raw_parts(invec.cast::<E::Stored>(), n),
            std::slice::from_raw_parts_mut(inoutvec.cast::<E::Stored>(), n),
        )
    };
    for (a, b) in acc.iter_mut().zip(inc) {
        *a = E::add(*b, *a);
    }
}

#[cfg(test)]
mod tests {
    use lsgd_codec::wire::{bf16_bits, bf16_value};

    use super::super::chunks::Bf16;
    use super::*;

    #[test]
    fn the_user_function_adds_in_the_format_into_its_second_vector() {
        let mut inc = [bf16_bits(1.0), bf16_bits(2.0f32.powi(-8)), bf16_bits(-3.0)];
        let mut acc = [bf16_bits(2.0f32.powi(-8)), bf16_bits(1.0), bf16_bits(0.5)];
        let mut len: c_int = 3;
        // SAFETY: both vectors hold `len` u16 values, Bf16's stored type.
        unsafe {
            sum::<Bf16>(
                inc.as_mut_ptr().cast(),
                acc.as_mut_ptr().cast(),
                &mut len,
                std::ptr::null_mut(),
            );
        }
        let got: Vec<f32> = acc.iter().map(|&h| bf16_value(h)).collect();
        assert_eq!(got, [1.0, 1.0, -2.5]);
        assert_eq!(bf16_value(inc[2]), -3.0);
    }
}
