//! Passes the linker version script that limits the cdylib's exports to the
//! glibc malloc family (see `exports.map`).

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
    }
}
