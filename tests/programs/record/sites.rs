//! sites (Rust, built with -O): allocations through `alloc` whose site must
//! be the caller, not `alloc::alloc` / `RawVec::grow_one`: `fill_vec` grows a
//! Vec by push, `make_strings` formats Strings, `boxes` allocates Boxes.
use std::hint::black_box;

#[inline(never)]
fn fill_vec() -> usize {
    let mut v: Vec<u64> = Vec::new();
    for i in 0..200_000 {
        v.push(i);
    }
    black_box(v.len())
}

#[inline(never)]
fn make_strings() -> usize {
    let mut n = 0;
    for i in 0..2000 {
        let s = format!("{i:0>120}");
        n += black_box(s).len();
    }
    n
}

#[inline(never)]
fn boxes() -> usize {
    let mut n = 0;
    for i in 0..3000u64 {
        let b = Box::new([i; 8]);
        n += black_box(b)[0] as usize;
    }
    n
}

fn main() {
    let n = fill_vec() + make_strings() + boxes();
    std::process::exit(if n > 0 { 0 } else { 1 });
}
