//! The sampler's cost per allocation and per sampled allocation, on a
//! stream of sizes from 16 to 4096 bytes at the default 4 KiB interval
//! (about one allocation in three is sampled), against the two figures
//! that bound it in the same run: a gap draw's latency (each draw waiting
//! for the one before) and its throughput (independent draws).
//!
//! `cargo bench -p heapprofd-client-core --bench sampler`

use std::hint::black_box;
use std::time::Instant;

use heapprofd_client_core::logarithm::ln_unit;
use heapprofd_client_core::sampler::{Sampler, mix64};

const CALLS: u64 = 20_000_000;
const DRAWS: u64 = 20_000_000;

/// One uniform in (0, 1] from splitmix64, as the sampler draws it.
fn uniform(state: u64) -> f64 {
    ((mix64(state) >> 11) + 1) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Nanoseconds per draw; `CHAINED`: each draw's state depends on the last
/// result (latency), else not (throughput).
fn draws<const CHAINED: bool>() -> f64 {
    let (mut state, mut acc) = (1u64, 0.0f64);
    let start = Instant::now();
    for _ in 0..DRAWS {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        if CHAINED {
            state ^= acc.to_bits() & 1;
        }
        acc += ln_unit(uniform(state));
    }
    black_box(acc);
    start.elapsed().as_nanos() as f64 / DRAWS as f64
}

fn main() {
    let mut r = 88_172_645_463_325_252u64;
    let sizes: Vec<usize> = (0..4096)
        .map(|_| {
            r ^= r << 13;
            r ^= r >> 7;
            r ^= r << 17;
            16 + (r % 4081) as usize
        })
        .collect();
    let mut sampler = Sampler::new(4096, 7);
    let (mut sampled, mut bytes) = (0u64, 0u64);
    let start = Instant::now();
    for i in 0..CALLS {
        let s = sampler.sample_size(sizes[(i & 4095) as usize]);
        if s != 0 {
            sampled += 1;
            bytes += s;
        }
    }
    let ns = start.elapsed().as_nanos() as f64;
    black_box(bytes);
    let latency = draws::<true>();
    let throughput = draws::<false>();
    println!(
        "sampler at 4 KiB: {:.2} ns per allocation, {:.1} ns per sampled one ({sampled} of {CALLS})",
        ns / CALLS as f64,
        ns / sampled as f64
    );
    println!(
        "gap draw: latency {latency:.1} ns, throughput {throughput:.1} ns; per sampled allocation = {:.2}x the latency",
        ns / sampled as f64 / latency
    );
}
