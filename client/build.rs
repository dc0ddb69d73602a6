//! Passes the linker version script that limits the cdylib's exports to the
//! glibc malloc family (see `exports.map`), `-Bsymbolic-functions` so the
//! library's own references to its hooks bind locally, and, on glibc, links
//! GCC's unwinder in (see `static_unwinder.rs`).

#[path = "static_unwinder.rs"]
mod static_unwinder;

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
    println!("cargo:rerun-if-changed=static_unwinder.rs");
    if let Some(arg) = static_unwinder::link_arg() {
        println!("cargo:rustc-cdylib-link-arg={arg}");
    }
}
