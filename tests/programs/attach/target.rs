//! A long-running Rust target for `record --pid` tests: worker threads
//! building strings and vectors (in `rust_worker_alloc`), and the stdin
//! commands of target.c: `work N` (prints "sum=<checksum>") and `quit`.

use std::io::BufRead;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

#[inline(never)]
fn rust_worker_alloc(seed: u64) -> usize {
    let mut v: Vec<String> = Vec::new();
    let mut x = seed;
    for i in 0..64 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        v.push("r".repeat(16 + (x % 300) as usize + i));
    }
    std::hint::black_box(&v);
    v.len()
}

#[inline(never)]
fn rust_target_work(n: u64) -> u64 {
    let mut x: u64 = 0x2545F4914F6CDD1D;
    let mut sum: u64 = 0;
    let mut boxes: Vec<Box<[u8]>> = Vec::new();
    for _ in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = vec![(x & 0xff) as u8; 8 + (x % 200) as usize].into_boxed_slice();
        sum = sum.wrapping_mul(31).wrapping_add(b.len() as u64 + b[0] as u64);
        boxes.push(b);
        if boxes.len() > 300 {
            boxes.clear();
        }
    }
    sum
}

fn main() {
    let threads: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(2);
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..threads)
        .map(|id| {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut seed = id as u64 + 1;
                while !stop.load(Ordering::Relaxed) {
                    std::hint::black_box(rust_worker_alloc(seed));
                    seed += 1;
                    std::thread::sleep(std::time::Duration::from_micros(300));
                }
            })
        })
        .collect();
    println!("ready");
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        if let Some(n) = line.strip_prefix("work ") {
            println!("sum={}", rust_target_work(n.parse().unwrap_or(0)));
        } else if line == "quit" {
            break;
        } else {
            println!("unknown {line}");
        }
    }
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        let _ = h.join();
    }
    println!("bye");
}
