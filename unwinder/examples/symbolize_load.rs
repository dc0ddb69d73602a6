//! Times loading one module's symbols: `symbolize_load FILE REL_PC... [--reps N]`.
//!
//! Each repetition opens the file in a fresh [`ModuleCache`] and symbolizes
//! the given `rel_pc`s (hexadecimal), so the first lookup pays for the symbol
//! table and DWARF context (decompressing sections, parsing every unit's
//! header); prints the first lookup's time, the rest, and the names found.

use std::fs::File;
use std::path::Path;
use std::time::Instant;

use heapprofd_unwinder::{ModuleCache, SymbolizeOptions};

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut reps = 5;
    if let Some(i) = args.iter().position(|a| a == "--reps") {
        reps = args.get(i + 1).and_then(|r| r.parse().ok()).unwrap_or(5);
        args.drain(i..(i + 2).min(args.len()));
    }
    let Some((path, pcs)) = args.split_first() else {
        eprintln!("usage: symbolize_load FILE REL_PC... [--reps N]");
        std::process::exit(2);
    };
    let pcs: Vec<u64> = pcs
        .iter()
        .filter_map(|p| u64::from_str_radix(p.trim_start_matches("0x"), 16).ok())
        .collect();
    for rep in 0..reps {
        let cache = ModuleCache::new(SymbolizeOptions::default());
        let file = File::open(path).expect("open the module");
        let module = cache
            .module_for_file(&file, Path::new(path))
            .expect("an ELF file");
        let t0 = Instant::now();
        let mut names = Vec::new();
        let mut first = None;
        for &pc in &pcs {
            let frames = module.symbolize(pc);
            first.get_or_insert_with(|| t0.elapsed());
            names.push(
                frames
                    .iter()
                    .filter_map(|f| f.function.clone())
                    .collect::<Vec<_>>()
                    .join(" < "),
            );
        }
        let total = t0.elapsed();
        let first = first.unwrap_or_default();
        println!(
            "rep {rep}: first {:.1} ms, rest {:.2} ms",
            first.as_secs_f64() * 1e3,
            (total - first).as_secs_f64() * 1e3
        );
        if rep == 0 {
            for (pc, n) in pcs.iter().zip(&names) {
                println!("  {pc:#x} {n}");
            }
        }
    }
}
