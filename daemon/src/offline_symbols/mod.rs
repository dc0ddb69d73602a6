//! `heapprofd-rs symbolize TRACE --symbols DIR[:DIR...] -o OUT`: adds
//! symbols to a trace whose frames have only build ids and addresses (one
//! recorded with `--no-symbolize`, on a device, or by Perfetto's own
//! heapprofd without symbols), written as trace_processor reads offline
//! symbols: a `ModuleSymbols` packet per module (path and raw build id as
//! the mapping has them, each address with its inline chain, innermost
//! first), appended to a copy of the trace.
//!
//! [`frames`] finds the unnamed frames per module, [`binaries`] the
//! binaries by build id in the symbol directories.

pub mod binaries;
pub mod frames;

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use heapprofd_proto::perfetto::prost::encoding::encode_varint;
use heapprofd_proto::perfetto::{
    AddressSymbols, Line, Message, ModuleSymbols, Trace, TracePacket, trace_packet,
};
use heapprofd_unwinder::{ModuleCache, SymbolizeOptions};

/// `symbolize`'s arguments.
#[derive(Debug, clap::Args)]
pub struct SymbolizeArgs {
    /// The trace to symbolize.
    #[arg(value_name = "TRACE")]
    pub trace: PathBuf,
    /// Directories holding the binaries (unstripped, or with their debug
    /// files), searched in order like PERFETTO_BINARY_PATH: DIR/<mapping
    /// path>, DIR/<file name> (each also without a `base.apk!` prefix),
    /// DIR/.build-id/xx/rest.debug; matched by build id. A stripped
    /// binary's debug file is found by build id (DIR/.build-id/...,
    /// /usr/lib/debug/.build-id/...) or by its .gnu_debuglink (beside it,
    /// in .debug/ beside it, or under a DIR or /usr/lib/debug at the
    /// mapping's directory; CRC32 checked). Several: `DIR:DIR` or the
    /// option repeated.
    #[arg(
        long = "symbols",
        value_name = "DIR[:DIR...]",
        required = true,
        value_delimiter = ':'
    )]
    pub symbols: Vec<PathBuf>,
    /// Where to write the symbolized trace.
    #[arg(short = 'o', long = "output", value_name = "OUT")]
    pub output: PathBuf,
}

/// Runs `symbolize`; returns the exit code.
pub fn run(args: &SymbolizeArgs) -> Result<i32> {
    for d in &args.symbols {
        if !d.is_dir() {
            bail!(
                "--symbols {}: not a directory; give the directories holding the binaries",
                d.display()
            );
        }
    }
    let bytes =
        std::fs::read(&args.trace).with_context(|| format!("reading {}", args.trace.display()))?;
    let trace = Trace::decode(&bytes[..]).with_context(|| {
        format!(
            "{} is not a Perfetto trace (protobuf decoding failed)",
            args.trace.display()
        )
    })?;
    let wanted = frames::unsymbolized(&trace);
    let mut debug_dirs = args.symbols.clone();
    debug_dirs.push(PathBuf::from("/usr/lib/debug"));
    let cache = ModuleCache::new(SymbolizeOptions {
        enabled: true,
        debug_dirs,
        store: None,
    });
    let mut packets = Vec::new();
    let mut missing = Vec::new();
    let mut addresses = 0usize;
    for ((path, build_id), pcs) in &wanted {
        if build_id.is_empty() {
            missing.push(format!("{path} (no build id in the trace)"));
            continue;
        }
        let Some((found, module)) = binaries::find(&cache, &args.symbols, path, build_id) else {
            missing.push(format!(
                "{path} (build id {})",
                heapprofd_unwinder::build_id_hex(build_id)
            ));
            continue;
        };
        let mut syms = Vec::new();
        for &pc in pcs {
            let chain = module.symbolize(pc);
            if chain.iter().all(|f| f.function.is_none()) {
                continue;
            }
            syms.push(AddressSymbols {
                address: Some(pc),
                lines: chain
                    .iter()
                    .map(|f| Line {
                        function_name: Some(f.function.clone().unwrap_or_else(|| "?".into())),
                        source_file_name: f.file.clone(),
                        line_number: f.line,
                    })
                    .collect(),
            });
        }
        let sources = module.symbol_sources();
        for refused in &sources.refused_debug_files {
            eprintln!(
                "heapprofd-rs: warning: {} is not {}'s debug file (its CRC32 is not the one \
                 the .gnu_debuglink names): not used",
                refused.display(),
                found.display()
            );
        }
        log::info!(
            "{path}: {} of {} addresses from {}{}",
            syms.len(),
            pcs.len(),
            found.display(),
            sources
                .debug_file
                .map(|d| format!(" and {}", d.display()))
                .unwrap_or_default()
        );
        addresses += syms.len();
        packets.push(TracePacket {
            data: Some(trace_packet::Data::ModuleSymbols(ModuleSymbols {
                path: Some(path.clone()),
                build_id: Some(build_id.clone()),
                address_symbols: syms,
            })),
            ..Default::default()
        });
    }
    if !wanted.is_empty() && packets.is_empty() {
        bail!(
            "no binary of the trace's {} modules was found in {} by build id (missing: {}); \
             give --symbols the directories holding them",
            wanted.len(),
            dirs_list(&args.symbols),
            missing.join(", ")
        );
    }
    let mut out = bytes;
    for p in &packets {
        // Each packet as one more `Trace.packet` (field 1, length-delimited).
        let body = p.encode_to_vec();
        out.push(0x0a);
        encode_varint(body.len() as u64, &mut out);
        out.extend_from_slice(&body);
    }
    let mut f = std::fs::File::create(&args.output)
        .with_context(|| format!("creating {}", args.output.display()))?;
    f.write_all(&out)
        .with_context(|| format!("writing {}", args.output.display()))?;
    eprintln!(
        "heapprofd-rs: symbolized {addresses} addresses in {} of {} modules; wrote {}",
        packets.len(),
        wanted.len(),
        args.output.display()
    );
    for m in &missing {
        eprintln!("heapprofd-rs: not found: {m}");
    }
    Ok(0)
}

fn dirs_list(dirs: &[PathBuf]) -> String {
    dirs.iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(":")
}
