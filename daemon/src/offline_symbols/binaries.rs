//! Finding a module's binary in the symbol directories, by Perfetto's
//! rules for `PERFETTO_BINARY_PATH` (trace_processor's local symbolizer,
//! `FindBinaryInRoot`): for each directory in order, the mapping's whole
//! path below it, the same with a `base.apk!` prefix taken off the file
//! name (a library mapped from inside an APK), the file name in it, the
//! file name without that prefix, then `.build-id/xx/rest.debug` in it;
//! the first candidate whose build id is the mapping's wins (a file of the
//! same name from another build is skipped). Split debug files and
//! `.gnu_debuglink` are followed by the unwinder's symbolizer once the
//! binary is found (the symbol directories are its debug directories too,
//! and the mapping's own directory is tried below them for a debuglink).

use std::path::{Path, PathBuf};

use heapprofd_unwinder::{Module, ModuleCache, build_id_path};

/// The prefix of a library's file name when it is mapped from an APK.
const APK_PREFIX: &str = "base.apk!";

/// The candidates for a module at `path` in `dir`, in search order.
pub fn candidates(dir: &Path, path: &str, build_id: &[u8]) -> Vec<PathBuf> {
    let mut v = Vec::new();
    let rel = path.trim_start_matches('/');
    let (parent, name) = match rel.rfind('/') {
        Some(i) => (&rel[..=i], &rel[i + 1..]),
        None => ("", rel),
    };
    let bare = name.strip_prefix(APK_PREFIX);
    if !parent.is_empty() {
        v.push(dir.join(rel));
        if let Some(b) = bare {
            v.push(dir.join(format!("{parent}{b}")));
        }
    }
    if !name.is_empty() {
        v.push(dir.join(name));
        if let Some(b) = bare.filter(|b| !b.is_empty()) {
            v.push(dir.join(b));
        }
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
            let Some(module) = cache.module_for_file_mapped_at(&file, &c, Path::new(path)) else {
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

    #[test]
    fn apk_prefix_taken_off_after_each_whole_name() {
        let c = candidates(
            Path::new("/sym"),
            "/data/app/com.example/base.apk!libfoo.so",
            &[0xab, 0xcd],
        );
        let want = [
            "/sym/data/app/com.example/base.apk!libfoo.so",
            "/sym/data/app/com.example/libfoo.so",
            "/sym/base.apk!libfoo.so",
            "/sym/libfoo.so",
            "/sym/.build-id/ab/cd.debug",
        ];
        assert_eq!(c, want.map(PathBuf::from));
        // A bare file name: no directory to try.
        let c = candidates(Path::new("/sym"), "app", &[]);
        assert_eq!(c, [PathBuf::from("/sym/app")]);
    }
}
