//! Passes the linker version script that limits the cdylib's exports to the
//! glibc malloc family (see `exports.map`), `-Bsymbolic-functions` so the
//! library's own references to its hooks bind locally, and, on glibc, links
//! GCC's unwinder in (see `static_unwinder`).

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let map = std::path::Path::new(&dir).join("exports.map");
    println!("cargo:rerun-if-changed={}", map.display());
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if os == "linux" || os == "android" {
        println!(
            "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
            map.display()
        );
        // References to our own exported hooks (their addresses, and hooks
        // calling hooks) bind to our definitions, not to whatever a global
        // lookup finds: a library loaded by an attach does not interpose, and
        // its GOT patching needs the addresses of its own functions.
        println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic-functions");
    }
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os == "linux" && env == "gnu" {
        static_unwinder();
    }
}

/// Links GCC's unwinder (`libgcc_eh.a`, the one std calls for backtraces and
/// panics) into the library, as `-static-libgcc` does for C, so that the
/// library no longer needs `libgcc_s.so.1`: every profiled process loads
/// the client's dependencies at start.
fn static_unwinder() {
    let target = std::env::var("TARGET").unwrap_or_default();
    let cc = std::env::var(format!("CC_{}", target.replace('-', "_")))
        .or_else(|_| std::env::var("CC"))
        .unwrap_or_else(|_| "cc".into());
    let Ok(out) = std::process::Command::new(&cc)
        .arg("-print-file-name=libgcc_eh.a")
        .output()
    else {
        return;
    };
    let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let path = std::path::Path::new(&path);
    let Some(dir) = path
        .parent()
        .filter(|_| path.is_absolute() && path.is_file())
    else {
        return;
    };
    println!("cargo:rustc-link-search=native={}", dir.display());
    println!("cargo:rustc-link-lib=static:+whole-archive,-bundle=gcc_eh");
}
