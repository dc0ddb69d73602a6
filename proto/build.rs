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
//! Without the feature (the client library's build) it does nothing.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_PERFETTO").is_none() {
        return Ok(());
    }
    #[cfg(feature = "perfetto")]
    perfetto::generate()?;
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
