//! MPI_Allreduce, the baseline every other algorithm is measured against.
//!
//! rsmpi 0.8.2 has no `MPI_IN_PLACE`, so the input is copied to a scratch buffer first (a
//! memcpy, small next to the reduction itself).

use mpi::collective::SystemOperation;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

/// In-place MPI_Allreduce (sum) over `comm`. Returns the bandwidth lower bound of bytes sent,
/// 2((p−1)/p)·n floats, since MPI does not say what it sent.
pub fn all_reduce(comm: &SimpleCommunicator, buf: &mut [f32], scratch: &mut Vec<f32>) -> u64 {
    let p = comm.size() as u64;
    scratch.clear();
    scratch.extend_from_slice(buf);
    comm.all_reduce_into(&scratch[..], buf, SystemOperation::sum());
    2 * (p - 1) * size_of_val(buf) as u64 / p
}
