//! Rust: Vec, String, Box and HashMap churn from 8 threads (the std
//! allocator is malloc, so the preloaded hooks see everything).
use std::collections::HashMap;
fn work(id: u64) -> u64 {
    let mut sum = 0u64;
    let mut s = id.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for round in 0..300u64 {
        let mut v: Vec<String> = Vec::new();
        let mut m: HashMap<u64, Box<[u8]>> = HashMap::new();
        for i in 0..100u64 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let n = (s % 2000) as usize + 1;
            v.push("x".repeat(n));
            m.insert(i, vec![(i % 251) as u8; n].into_boxed_slice());
        }
        sum += v.iter().map(|x| x.len() as u64).sum::<u64>();
        sum += m.values().map(|b| b[0] as u64).sum::<u64>() + round;
    }
    sum
}
fn main() {
    let handles: Vec<_> = (0..8).map(|i| std::thread::spawn(move || work(i))).collect();
    let total: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    println!("rust checksum={total}");
}
