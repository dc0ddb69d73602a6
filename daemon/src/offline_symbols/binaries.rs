//! Finding a module's binary in the symbol directories, as Perfetto's
//! `PERFETTO_BINARY_PATH` is searched (`traceconv symbolize`): for each
//! directory in order, the mapping's whole path below it, then its file
//! name in it, then `.build-id/xx/rest.debug` in it; the first candidate
//! whose build id is the mapping's wins (a file of the same name from
//! another build is skipped). Split debug files and `.gnu_debuglink` are
//! followed by the unwinder's symbolizer once the binary is found (the
//! symbol directories are its debug directories too).

use std::path::{Path, PathBuf};

use heapprofd_unwinder::{Module, ModuleCache, build_id_path};

/// The candidates for a module at `path` in `dir`, in search order.
pub fn candidates(dir: &Path, path: &str, build_id: &[u8]) -> Vec<PathBuf> {
    let mut v = Vec::new();
    let rel = path.trim_start_matches('/');
    if !rel.is_empty() {
        v.push(dir.join(rel));
    }
    if let Some(name) = Path::new(path).file_name() {
        v.push(dir.join(name));
    }
    if let Some(p) = build_id_path(dir, build_id) {
        v.push(p);
    }
    v.dedup();
    v
}

/// The first candidate in `dirs` with build id `build_id`, loaded.
pub fn find(
    cache: &ModuleCache,
    dirs: &[PathBuf],
    path: &str,
    build_id: &[u8],
) -> Option<(PathBuf, std::sync::Arc<Module>)> {
    for dir in dirs {
        for c in candidates(dir, path, build_id) {
            let Ok(file) = std::fs::File::open(&c) else {
                continue;
            };
            let Some(module) = cache.module_for_file(&file, &c) else {
                continue;
            };
            if module.build_id() == Some(build_id) {
                return Some((c, module));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_path_then_file_name_then_build_id() {
        let c = candidates(
            Path::new("/sym"),
            "/system/lib64/libc.so",
            &[0xab, 0xcd, 0xef],
        );
        assert_eq!(
            c,
            [
                PathBuf::from("/sym/system/lib64/libc.so"),
                PathBuf::from("/sym/libc.so"),
                PathBuf::from("/sym/.build-id/ab/cdef.debug"),
            ]
        );
    }
}
