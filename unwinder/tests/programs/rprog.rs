//! Test program for the unwinder's gdb comparison tests (Rust, release).
//! main -> recurse(depth) ... -> recurse(0) -> Iterator::map closure -> leaf.
//! The tests put a breakpoint on `rprog::leaf`.

// No inlined call at the breakpoint address: gdb reports a stop at the
// first instruction of an inlined block in the caller's frame.
#[inline(never)]
fn leaf(mut x: u64) -> u64 {
    // SAFETY: an empty asm block that only claims to modify x.
    unsafe { std::arch::asm!("/* {0} */", inout(reg) x) };
    x
}

#[inline(never)]
fn recurse(n: u32, v: &[u64]) -> u64 {
    if n == 0 {
        return v.iter().map(|&x| leaf(x)).sum();
    }
    let r = recurse(n - 1, v);
    std::hint::black_box(r) + 1
}

fn main() {
    let depth: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(5);
    let v = vec![1u64, 2, 3];
    println!("{}", recurse(std::hint::black_box(depth), &v));
}
