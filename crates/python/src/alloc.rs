//! The extension's allocator: the system's, keeping a few freed large blocks for reuse.
//!
//! A bucket's exchange allocates the same few sizes every step (each round's payload, the
//! sums, the decoded floats, megabytes each) and frees them within milliseconds. glibc returns
//! such blocks to the kernel (`munmap`, or a heap trim) and the next step faults every page
//! back in, zeroed: measured on a 1M-float bucket through `codec-identity`, that was half of
//! the exchange's time. Blocks of [`LARGE`] bytes or more are kept here instead, up to
//! [`SLOTS`] of them and [`KEPT`] bytes in all, and handed out again for a request of the same
//! size and alignment. Only this extension's own allocations (the runtime, wasmtime's lifted
//! lists) come here: Python's and PyTorch's memory is untouched.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Mutex;

/// The smallest block kept: below it glibc's own free lists already reuse memory.
const LARGE: usize = 1 << 20;
/// At most this many blocks are kept.
const SLOTS: usize = 16;
/// At most this many bytes are kept.
const KEPT: usize = 128 << 20;

/// A kept block: its address and the layout it was allocated with (size 0: an empty slot).
#[derive(Clone, Copy)]
struct Slot {
    addr: usize,
    size: usize,
    align: usize,
}

const EMPTY: Slot = Slot {
    addr: 0,
    size: 0,
    align: 0,
};

/// The system allocator with a small cache of freed large blocks.
pub struct Recycling {
    kept: Mutex<[Slot; SLOTS]>,
}

impl Recycling {
    /// An empty cache.
    pub const fn new() -> Self {
        Recycling {
            kept: Mutex::new([EMPTY; SLOTS]),
        }
    }

    fn take(&self, layout: Layout) -> Option<*mut u8> {
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        let slot = kept
            .iter_mut()
            .find(|s| s.size == layout.size() && s.align == layout.align())?;
        let addr = slot.addr;
        *slot = EMPTY;
        Some(addr as *mut u8)
    }

    /// Keeps `ptr` if there is room; false when the caller must free it.
    fn keep(&self, ptr: *mut u8, layout: Layout) -> bool {
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        let total: usize = kept.iter().map(|s| s.size).sum();
        if total + layout.size() > KEPT {
            return false;
        }
        match kept.iter_mut().find(|s| s.size == 0) {
            Some(slot) => {
                *slot = Slot {
                    addr: ptr as usize,
                    size: layout.size(),
                    align: layout.align(),
                };
                true
            }
            None => false,
        }
    }
}

impl Default for Recycling {
    fn default() -> Self {
        Self::new()
    }
}

// SAFETY: every block handed out is one `System` allocated with exactly the layout asked for
// (a kept block is matched on size and alignment), so `System` may free or resize any of them;
// a block is in the cache or in use, never both (taken and kept under the lock).
unsafe impl GlobalAlloc for Recycling {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() >= LARGE
            && let Some(ptr) = self.take(layout)
        {
            return ptr;
        }
        // SAFETY: the caller's layout has a non-zero size (GlobalAlloc's contract).
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if layout.size() >= LARGE && self.keep(ptr, layout) {
            return;
        }
        // SAFETY: `ptr` was allocated by `System` with `layout` (see above).
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // Fresh pages come zeroed from the kernel: a kept block would need clearing.
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` is a `System` block of `layout` (see above); the caller's new size is
        // valid for its alignment.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
