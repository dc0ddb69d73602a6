//! A Rust program whose global allocator reports into the custom heap
//! "rust" with the `heapprofd-api` crate (the ground-truth program of
//! `tests/tests/custom_heaps.rs`; keep the counts in sync).
//!
//! `Reporting` wraps the system allocator: once `main` has registered the
//! heap, every allocation and free of the program is reported by its
//! address. `fill` keeps 1000 boxes of 200 bytes, `churn` allocates and
//! drops 500 vectors of 300 bytes. Prints `heap=ID enabled=N` at the end.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use heapprofd_api::{EnableInfo, Heap, HeapInfo};

/// The heap's id, 0 until registered.
static HEAP: AtomicU32 = AtomicU32::new(0);
static ENABLED: AtomicUsize = AtomicUsize::new(0);

struct Reporting;

// SAFETY: forwards to the system allocator; reporting has no effect on
// the memory handed out.
unsafe impl GlobalAlloc for Reporting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's layout, passed on.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null()
            && let Some(h) = Heap::from_id(HEAP.load(Ordering::Relaxed))
        {
            h.report_allocation(p as u64, layout.size() as u64);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if let Some(h) = Heap::from_id(HEAP.load(Ordering::Relaxed)) {
            h.report_free(ptr as u64);
        }
        // SAFETY: as allocated above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Reporting = Reporting;

unsafe extern "C" fn on_enabled(_data: *mut core::ffi::c_void, _info: *const EnableInfo) {
    ENABLED.fetch_add(1, Ordering::SeqCst);
}

// One allocation per element is the point: 1000 reported boxes.
#[allow(clippy::vec_box)]
#[inline(never)]
fn fill() -> Vec<Box<[u8; 200]>> {
    let mut keep = Vec::with_capacity(1000);
    for i in 0..1000 {
        keep.push(black_box(Box::new([i as u8; 200])));
    }
    keep
}

#[inline(never)]
fn churn() -> usize {
    let mut n = 0;
    for i in 0..500 {
        let v: Vec<u8> = black_box(Vec::with_capacity(300));
        n += v.capacity() + i;
    }
    n
}

fn main() {
    // SAFETY: the callback only bumps an atomic, from any thread.
    let heap = HeapInfo::create(c"rust")
        .map(|i| unsafe { i.on_enabled(on_enabled, core::ptr::null_mut()) })
        .and_then(HeapInfo::register);
    if let Some(h) = heap {
        HEAP.store(h.id(), Ordering::Relaxed);
    }
    let kept = fill();
    let n = churn();
    println!(
        "heap={} enabled={} kept={} churned={n}",
        heap.map_or(0, Heap::id),
        ENABLED.load(Ordering::SeqCst),
        kept.len()
    );
}
