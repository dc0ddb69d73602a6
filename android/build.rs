//! Passes the linker version script that limits the cdylib's exports to
//! bionic's `heapprofd_*` hook ABI (see `exports.map`). `pvalloc` and
//! `valloc` exist only on 32-bit targets (bionic's
//! `HAVE_DEPRECATED_MALLOC_FUNCS`): for 64-bit ones the script is written
//! to `OUT_DIR` without their lines (lld refuses a name that is not
//! defined).

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let map = std::path::Path::new(&dir).join("exports.map");
    println!("cargo:rerun-if-changed={}", map.display());
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if os != "linux" && os != "android" {
        return;
    }
    let text = std::fs::read_to_string(&map).expect("android/exports.map");
    let lp32 = std::env::var("CARGO_CFG_TARGET_POINTER_WIDTH").is_ok_and(|w| w == "32");
    let script: String = text
        .lines()
        .filter(|l| lp32 || !matches!(l.trim(), "heapprofd_pvalloc;" | "heapprofd_valloc;"))
        .map(|l| format!("{l}\n"))
        .collect();
    let out = std::path::Path::new(&std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"))
        .join("exports.map");
    std::fs::write(&out, script).expect("writing the version script");
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        out.display()
    );
}
