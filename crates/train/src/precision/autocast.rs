//! libtorch's autocast for one device type, as an RAII region (what `with torch.autocast(…)`
//! is in Python). tch's own `autocast` switches CUDA only, through a deprecated call, so the
//! per-device-type switches come from a small C++ shim (`autocast.cpp`, built by build.rs).
//!
//! Autocast state is thread-local in libtorch: a region covers the calls this thread makes
//! while it is alive. The backward pass needs no region; it runs each op in the kinds the
//! forward pass recorded.

use tch::{Device, Kind};

use crate::Error;

unsafe extern "C" {
    fn lsgd_autocast_set(
        device_type: i8,
        enabled: bool,
        dtype: i8,
        was_enabled: *mut bool,
        was_dtype: *mut i8,
    ) -> i32;
    fn lsgd_autocast_nest(enter: bool) -> i32;
}

/// `c10::DeviceType` of the devices lsgd-host trains on.
fn device_type(device: Device) -> Option<i8> {
    match device {
        Device::Cpu => Some(0),
        Device::Cuda(_) => Some(1),
        _ => None,
    }
}

/// `c10::ScalarType` of the kinds autocast computes in.
fn scalar_type(kind: Kind) -> Option<i8> {
    match kind {
        Kind::Half => Some(5),
        Kind::BFloat16 => Some(15),
        _ => None,
    }
}

/// An autocast region: enabled for one device type and kind from [`Autocast::enter`] until
/// dropped, when the previous setting comes back.
#[derive(Debug)]
pub struct Autocast {
    device_type: i8,
    was_enabled: bool,
    was_dtype: i8,
}

impl Autocast {
    /// Autocasts the ops on `device` to `kind` (`Half` or `BFloat16`) until the region is
    /// dropped; `None` when `kind` is `None` (fp32: nothing to enter).
    pub fn enter(device: Device, kind: Option<Kind>) -> Result<Option<Autocast>, Error> {
        let Some(kind) = kind else {
            return Ok(None);
        };
        let unsupported = || {
            Error::Config(format!(
                "autocast to {kind:?} on {device:?} is not supported"
            ))
        };
        let dt = device_type(device).ok_or_else(unsupported)?;
        let st = scalar_type(kind).ok_or_else(unsupported)?;
        let (mut was_enabled, mut was_dtype) = (false, 0i8);
        // SAFETY: the shim catches every C++ exception, and the out pointers are valid locals.
        if unsafe { lsgd_autocast_set(dt, true, st, &mut was_enabled, &mut was_dtype) } != 0 {
            return Err(unsupported());
        }
        // SAFETY: as above; nesting only counts regions.
        unsafe { lsgd_autocast_nest(true) };
        Ok(Some(Autocast {
            device_type: dt,
            was_enabled,
            was_dtype,
        }))
    }
}

impl Drop for Autocast {
    fn drop(&mut self) {
        let (mut enabled, mut dtype) = (false, 0i8);
        // SAFETY: as in `enter`; restoring values libtorch itself returned cannot fail.
        unsafe {
            lsgd_autocast_nest(false);
            lsgd_autocast_set(
                self.device_type,
                self.was_enabled,
                self.was_dtype,
                &mut enabled,
                &mut dtype,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Tensor;

    #[test]
    fn a_region_computes_matrix_products_in_its_kind_and_ends_with_the_region() {
        let a = Tensor::ones([4, 4], (Kind::Float, Device::Cpu));
        for kind in [Kind::BFloat16, Kind::Half] {
            {
                let _region = Autocast::enter(Device::Cpu, Some(kind)).unwrap().unwrap();
                assert_eq!(a.matmul(&a).kind(), kind);
                // Outside autocast's lists (elementwise): left in fp32.
                assert_eq!((&a + 1.0).kind(), Kind::Float);
                {
                    let _inner = Autocast::enter(Device::Cpu, Some(kind)).unwrap();
                    assert_eq!(a.matmul(&a).kind(), kind);
                }
                assert_eq!(
                    a.matmul(&a).kind(),
                    kind,
                    "an inner region leaves the outer on"
                );
            }
            assert_eq!(a.matmul(&a).kind(), Kind::Float);
        }
        assert!(Autocast::enter(Device::Cpu, None).unwrap().is_none());
        assert!(Autocast::enter(Device::Cpu, Some(Kind::Int8)).is_err());
    }
}
