//! Build script: compiles `protos/*.proto` into prost code when the
//! `perfetto` feature is on.
//!
//! The `.proto` files are parsed by protox (pure Rust), so no system `protoc`
//! is needed. Outputs in `OUT_DIR`:
//!
//! * `perfetto.protos.rs`: the prost messages (named after the package);
//! * `perfetto_descriptor.bin`: the encoded `FileDescriptorSet`, exported as
//!   `perfetto::FILE_DESCRIPTOR_SET` so tests can compare the schema with
//!   the official one.
//!
//! Without the feature (the client library's build) it does only this:
//! `HEAPPROFD_PROTOCOL_HASH`, a hash of the sources of every contract the
//! client and the daemon share (this crate's `src/` and shmem's), which
//! `heapprofd_proto::BUILD_TAG` carries: `heapprofd-rs install` refuses a
//! client library whose tag differs from its own.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=build.rs");
    protocol_hash()?;
    if std::env::var_os("CARGO_FEATURE_PERFETTO").is_none() {
        return Ok(());
    }
    #[cfg(feature = "perfetto")]
    perfetto::generate()?;
    Ok(())
}

/// FNV-1a (64 bits) over the relative path and bytes of every `.rs` file
/// of `src/` and `../shmem/src/`, in path order.
fn protocol_hash() -> Result<(), Box<dyn std::error::Error>> {
    fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) -> std::io::Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            if path.is_dir() {
                walk(&path, out)?;
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
        Ok(())
    }
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            hash ^= u64::from(b);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    for root in ["src", "../shmem/src"] {
        println!("cargo:rerun-if-changed={root}");
        let mut files = Vec::new();
        walk(std::path::Path::new(root), &mut files)?;
        files.sort();
        for f in files {
            eat(f.to_string_lossy().as_bytes());
            eat(&std::fs::read(&f)?);
        }
    }
    println!("cargo:rustc-env=HEAPPROFD_PROTOCOL_HASH={hash:016x}");
    Ok(())
}

#[cfg(feature = "perfetto")]
mod perfetto {
    use std::error::Error;
    use std::path::PathBuf;

    /// Directory of the `.proto` files, relative to the crate root.
    const PROTO_DIR: &str = "protos";

    pub fn generate() -> Result<(), Box<dyn Error>> {
        println!("cargo:rerun-if-changed={PROTO_DIR}");
        let mut files: Vec<PathBuf> = std::fs::read_dir(PROTO_DIR)?
            .map(|entry| entry.map(|e| e.path()))
            .collect::<Result<_, _>>()?;
        files.retain(|p| p.extension().is_some_and(|ext| ext == "proto"));
        files.sort();
        for f in &files {
            println!("cargo:rerun-if-changed={}", f.display());
        }

        let mut compiler = protox::Compiler::new([PROTO_DIR])?;
        compiler.include_imports(true).include_source_info(true);
        compiler.open_files(&files)?;
        // With source info, prost turns the .proto comments into doc comments.
        let fds = compiler.file_descriptor_set();
        // The exported descriptor needs no comments.
        compiler.include_source_info(false);
        let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").ok_or("OUT_DIR is not set")?);
        std::fs::write(
            out_dir.join("perfetto_descriptor.bin"),
            compiler.encode_file_descriptor_set(),
        )?;

        prost_build::Config::new().compile_fds(fds)?;
        Ok(())
    }
}
