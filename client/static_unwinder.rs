//! For the client's build script: the linker argument that puts GCC's
//! unwinder (`libgcc_eh.a`, what std's panics and backtraces call) into
//! the library, as `-static-libgcc` does for C, so that it no longer needs
//! `libgcc_s.so.1`: every program that loads the client maps and relocates
//! one object less at start. (With libm gone too, a dormant client cost
//! `/bin/true` 0.79-0.97 ms instead of 1.24-1.35 ms of wall time in 300
//! runs, against 0.71-0.82 ms without it. The same for `heapprofd-rs`
//! itself made no difference that `perf stat` could see, so it is not done.)
//!
//! glibc targets only (`target_env = "gnu"`): Android's NDK has its own
//! unwinder. The archive is found by asking the target's C compiler
//! (`CC_<target>`, else `CC`, else `cc`); when it cannot be found the
//! library links `libgcc_s` as before.

/// `-Wl,--push-state,--whole-archive,<libgcc_eh.a>,--pop-state`, or `None`
/// when the target is not glibc or the archive is not found. Its objects
/// come after std's references to them, hence whole: they define the
/// unwinder's functions (locally, behind the version script), and the
/// linker then has no reference left for `libgcc_s`.
pub fn link_arg() -> Option<String> {
    let os = std::env::var("CARGO_CFG_TARGET_OS").ok()?;
    let env = std::env::var("CARGO_CFG_TARGET_ENV").ok()?;
    if os != "linux" || env != "gnu" {
        return None;
    }
    let target = std::env::var("TARGET").unwrap_or_default();
    let cc = std::env::var(format!("CC_{}", target.replace('-', "_")))
        .or_else(|_| std::env::var("CC"))
        .unwrap_or_else(|_| "cc".into());
    let out = std::process::Command::new(&cc)
        .arg("-print-file-name=libgcc_eh.a")
        .output()
        .ok()?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let p = std::path::Path::new(&path);
    (p.is_absolute() && p.is_file() && !path.contains(','))
        .then(|| format!("-Wl,--push-state,--whole-archive,{path},--pop-state"))
}
