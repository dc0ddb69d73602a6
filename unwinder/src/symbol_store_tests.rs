//! Tests of the symbol store: its encoding against damaged files, the
//! checks that keep stale answers out, its budget, and a module symbolized
//! from the store without its debug information.

use std::time::Duration;

use super::*;
use crate::{ModuleCache, SymbolizeOptions};

use crate::symbol_frame::SymbolFrame;
fn frame(function: Option<&str>, file: Option<&str>, line: Option<u32>) -> SymbolFrame {
    SymbolFrame {
        function: function.map(str::to_owned),
        file: file.map(str::to_owned),
        line,
    }
}

fn key(dir: &Path) -> StoreKey {
    let module = dir.join("module");
    fs::write(&module, b"module bytes").expect("module");
    StoreKey {
        build_id: Arc::from(&[0xab, 0xcd, 0xef][..]),
        module: FileKey::of(&fs::metadata(&module).expect("stat")),
        path: module,
    }
}

fn answers() -> Vec<(u64, Vec<SymbolFrame>)> {
    vec![
        (
            0x1234,
            vec![
                frame(Some("inlined<T>"), Some("/src/a.rs"), Some(7)),
                frame(Some("outer ü"), Some("/src/b.rs"), Some(70_000)),
            ],
        ),
        (0x10, vec![frame(None, None, None)]),
        (u64::MAX, vec![frame(Some("f"), None, Some(1))]),
    ]
}

fn encoded(k: &StoreKey, observed: &[Observation]) -> Vec<u8> {
    let a = answers();
    encode(k, observed, a.iter().map(|(pc, f)| (*pc, &f[..])))
}

#[test]
fn answers_and_observations_survive_the_round_trip() {
    let dir = tempfile::tempdir().expect("temp dir");
    let k = key(dir.path());
    let observed = vec![
        Observation::now(&k.path),
        Observation::now(&dir.path().join("absent.debug")),
    ];
    let file = decode(encoded(&k, &observed)).expect("decodes");
    assert_eq!(file.module, k.module);
    assert_eq!(file.build_id, &k.build_id[..]);
    assert_eq!(file.observed, observed);
    assert!(file.observed[0].file.is_some() && file.observed[1].file.is_none());
    assert_eq!(file.answers.len(), 3);
    for (pc, frames) in answers() {
        assert_eq!(&file.answers.get(pc).expect("answered")[..], &frames[..]);
    }
}

/// Every truncation and every changed byte is refused by the checksum;
/// with the checksum made right again, the parser still never panics and
/// reads nothing past its input.
#[test]
fn damaged_files_are_refused_without_a_panic() {
    let dir = tempfile::tempdir().expect("temp dir");
    let k = key(dir.path());
    let good = encoded(&k, &[Observation::now(&k.path)]);
    for len in 0..good.len() {
        assert!(decode(good[..len].to_vec()).is_none(), "truncated at {len}");
    }
    let body = good.len() - 4;
    for i in 0..body {
        for flip in [0x01u8, 0x80, 0xff] {
            let mut bad = good.clone();
            bad[i] ^= flip;
            assert!(
                decode(bad.clone()).is_none(),
                "byte {i} ^ {flip:#x} passed the checksum"
            );
            let crc = crc32fast::hash(&bad[..body]);
            bad[body..].copy_from_slice(&crc.to_le_bytes());
            let _ = decode(bad);
        }
    }
}

#[test]
fn a_file_is_used_only_while_what_it_was_made_from_is_unchanged() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SymbolStore::new(dir.path().join("store"), 1 << 20);
    let k = key(dir.path());
    let dirs = vec![dir.path().join("debug")];
    let debug = dir.path().join("prog.debug");
    let observed = vec![Observation::now(&debug)];
    let a = answers();
    let save = || {
        store
            .save(&k, &dirs, &observed, a.iter().map(|(pc, f)| (*pc, &f[..])))
            .expect("saved")
    };
    save();
    let loaded = store.load(&k, &dirs).expect("current");
    assert_eq!(loaded.answers.len(), 3);
    assert_eq!(loaded.observed, observed);
    // Other debug directories: another file.
    assert!(store.load(&k, &[dir.path().join("other")]).is_none());
    // Another module file with the same build id and path.
    let mut other = k.clone();
    other.module.mtime_nsec += 1;
    assert!(store.load(&other, &dirs).is_none());
    // A debug file appears where none was.
    fs::write(&debug, b"debug").expect("debug file");
    assert!(store.load(&k, &dirs).is_none());
    // Saved with it; then it changes.
    let observed = vec![Observation::now(&debug)];
    store
        .save(&k, &dirs, &observed, a.iter().map(|(pc, f)| (*pc, &f[..])))
        .expect("saved");
    assert!(store.load(&k, &dirs).is_some());
    fs::write(&debug, b"another debug").expect("debug file");
    assert!(store.load(&k, &dirs).is_none());
    // Garbage and a FIFO where the file should be: ignored.
    let path = store.file_for(&k, &dirs);
    fs::write(&path, b"garbage").expect("garbage");
    assert!(store.load(&k, &dirs).is_none());
    fs::remove_file(&path).expect("rm");
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "fifo");
    assert!(store.load(&k, &dirs).is_none());
}

/// Sets `p`'s mtime `age` seconds back.
fn set_age(p: &Path, age: u64) {
    let t = std::time::SystemTime::now() - Duration::from_secs(age);
    fs::File::options()
        .write(true)
        .open(p)
        .and_then(|f| f.set_modified(t))
        .expect("mtime");
}

/// Writes 4,000 bytes at `p`, last modified `age` seconds ago.
fn write_aged(p: &Path, age: u64) {
    fs::write(p, vec![0u8; 4000]).expect("file");
    set_age(p, age);
}

/// Only the store's own files (by name) count and go, oldest first; a
/// file of another name in the directory is never removed.
#[test]
fn the_oldest_files_go_beyond_the_budget() {
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path().join("store");
    fs::create_dir_all(&root).expect("dir");
    let old = |i: u64| root.join(format!("{i:02x}-{i:016x}.sym"));
    for (i, age) in [(0, 300), (1, 200), (2, 100)] {
        write_aged(&old(i), age);
    }
    let foreign = root.join("notes.txt");
    write_aged(&foreign, 1000);
    let store = SymbolStore::new(root.clone(), 5000);
    let k = key(dir.path());
    let a = answers();
    store
        .save(&k, &[], &[], a.iter().map(|(pc, f)| (*pc, &f[..])))
        .expect("saved");
    assert!(!old(0).exists() && !old(1).exists());
    assert!(old(2).exists());
    assert!(foreign.exists(), "a file not the store's was removed");
    assert!(store.load(&k, &[]).is_some(), "the new file stays");
}

/// The directory's size is looked at once per `trim_every`: a save soon
/// after a look leaves files over the budget; once the marker is older,
/// the next save removes them. The marker is never taken for a store
/// file.
#[test]
fn the_budget_is_looked_at_once_per_interval() {
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path().join("store");
    let store = SymbolStore::with_trim_every(root.clone(), 5000, Duration::from_secs(600));
    let k = key(dir.path());
    let a = answers();
    let save = || {
        store
            .save(&k, &[], &[], a.iter().map(|(pc, f)| (*pc, &f[..])))
            .expect("saved")
    };
    save();
    let marker = root.join(".trimmed");
    assert!(marker.is_file(), "no marker after the first save");
    let filler = |i: u64| root.join(format!("{i:02x}-{i:016x}.sym"));
    for i in 0..3 {
        write_aged(&filler(i), 300 - 100 * i);
    }
    save();
    assert!(
        (0..3).all(|i| filler(i).exists()),
        "looked at again within the interval"
    );
    set_age(&marker, 601);
    save();
    assert!(
        !filler(0).exists() && !filler(1).exists() && filler(2).exists(),
        "the budget was not kept once the interval passed"
    );
    assert!(marker.is_file(), "the marker was removed");
    assert!(store.load(&k, &[]).is_some(), "the new file stays");
}

#[test]
fn store_file_names() {
    for ok in ["ab-0123456789abcdef.sym", "0-0123456789ABCDEF.tmp42"] {
        assert!(is_store_file(OsStr::new(ok)), "{ok}");
    }
    for bad in [
        "ab-0123456789abcdef.txt",
        "ab-0123.sym",
        "-0123456789abcdef.sym",
        "xy-0123456789abcdef.sym",
        "ab-0123456789abcdef.tmp",
        "ab0123456789abcdef.sym",
        "passwd",
    ] {
        assert!(!is_store_file(OsStr::new(bad)), "{bad}");
    }
}

/// A store whose directory is a symbolic link (to a directory someone
/// else may control) is neither written nor read.
#[test]
fn a_linked_directory_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let target = dir.path().join("elsewhere");
    fs::create_dir_all(&target).expect("dir");
    let link = dir.path().join("store");
    std::os::unix::fs::symlink(&target, &link).expect("symlink");
    let store = SymbolStore::new(link, 1 << 20);
    let k = key(dir.path());
    let a = answers();
    let e = store
        .save(&k, &[], &[], a.iter().map(|(pc, f)| (*pc, &f[..])))
        .expect_err("a link is not the store's directory");
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
    assert_eq!(fs::read_dir(&target).expect("dir").count(), 0);
    assert!(store.load(&k, &[]).is_none());
}

/// Symbolization with a store in `dir`/s.
fn store_options(dir: &Path) -> SymbolizeOptions {
    SymbolizeOptions {
        store: Some(Arc::new(SymbolStore::new(dir.join("s"), 1 << 30))),
        ..SymbolizeOptions::default()
    }
}

/// The address of `f`, code of this test binary, less the binary's load
/// bias (a PIE linked at 0: the base `dladdr` gives).
fn rel_pc_of(f: *const ()) -> u64 {
    // SAFETY: `Dl_info` is plain data (pointers and integers): all zeros
    // is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: a code address of this binary, and a place for the answer.
    let found = unsafe { libc::dladdr(f.cast(), &mut info) };
    assert_ne!(found, 0);
    (f as usize - info.dli_fbase as usize) as u64
}

/// A module symbolized in one cache is named by the next from the store
/// alone: the same answers, and its symbols never loaded.
#[test]
fn a_second_run_names_from_the_store_without_loading_symbols() {
    let dir = tempfile::tempdir().expect("temp dir");
    let exe = std::env::current_exe().expect("test binary");
    let options = || store_options(dir.path());
    let rel_pc = rel_pc_of(a_second_run_names_from_the_store_without_loading_symbols as *const ());
    let first = ModuleCache::new(options());
    let file = fs::File::open(&exe).expect("open");
    let m = first.module_for_file(&file, &exe).expect("module");
    let named = m.symbolize(rel_pc);
    assert!(named.iter().any(|f| {
        f.function
            .as_deref()
            .is_some_and(|n| n.contains("a_second_run_names_from_the_store"))
    }));
    assert_eq!(first.persist_symbols().0, 1);
    assert_eq!(first.persist_symbols().0, 0, "nothing new to write");

    let second = ModuleCache::new(options());
    let m2 = second.module_for_file(&file, &exe).expect("module");
    assert_eq!(m2.symbolize(rel_pc), named);
    assert_eq!(m2.warm_symbols(rel_pc).as_deref(), Some(&named[..]));
    assert!(!m2.symbols_loaded(), "answered from the store");
    // An address the store does not have loads them.
    let _ = m2.symbolize(rel_pc + 1);
    assert!(m2.symbols_loaded());
}

/// A run that finds new answers keeps the stored ones it never asked for
/// (copied as they were), and a later run has both, from the store alone.
#[test]
fn a_save_keeps_the_stored_answers_it_did_not_ask_for() {
    let dir = tempfile::tempdir().expect("temp dir");
    let exe = std::env::current_exe().expect("test binary");
    let options = || store_options(dir.path());
    let old_pc = rel_pc_of(a_save_keeps_the_stored_answers_it_did_not_ask_for as *const ());
    let new_pc = rel_pc_of(rel_pc_of as *const ());
    let file = fs::File::open(&exe).expect("open");
    let first = ModuleCache::new(options());
    let old_named = first
        .module_for_file(&file, &exe)
        .expect("module")
        .symbolize(old_pc);
    assert_eq!(first.persist_symbols().0, 1);

    let second = ModuleCache::new(options());
    let new_named = second
        .module_for_file(&file, &exe)
        .expect("module")
        .symbolize(new_pc);
    assert!(new_named.iter().any(|f| {
        f.function
            .as_deref()
            .is_some_and(|n| n.contains("rel_pc_of"))
    }));
    assert_eq!(second.persist_symbols().0, 1);

    let third = ModuleCache::new(options());
    let m3 = third.module_for_file(&file, &exe).expect("module");
    assert_eq!(m3.symbolize(old_pc), old_named, "kept from the first run");
    assert_eq!(m3.symbolize(new_pc), new_named, "found by the second");
    assert!(!m3.symbols_loaded(), "both answered from the store");
}

/// A module the cache evicts writes its new answers to the store as it
/// goes: a later cache names the address from the store without loading
/// the module's symbols, though `persist_symbols` was never called.
#[test]
fn an_evicted_module_leaves_its_answers_in_the_store() {
    let dir = tempfile::tempdir().expect("temp dir");
    let exe = std::env::current_exe().expect("test binary");
    let options = || store_options(dir.path());
    let rel_pc = rel_pc_of(an_evicted_module_leaves_its_answers_in_the_store as *const ());
    let evicting = ModuleCache::with_budget(
        options(),
        crate::eviction::CacheBudget {
            max_unused_modules: 0,
            max_unused_bytes: 0,
        },
    );
    let file = fs::File::open(&exe).expect("open");
    let m = evicting.module_for_file(&file, &exe).expect("module");
    let named = m.symbolize(rel_pc);
    drop(m);
    assert_eq!(
        fs::read_dir(dir.path().join("s")).map_or(0, |d| d.count()),
        0
    );
    evicting.trim();
    assert_eq!(evicting.len(), 0, "evicted");
    let later = ModuleCache::new(options());
    let m2 = later.module_for_file(&file, &exe).expect("module");
    assert_eq!(m2.symbolize(rel_pc), named);
    assert!(!m2.symbols_loaded(), "answered from the store");
}
