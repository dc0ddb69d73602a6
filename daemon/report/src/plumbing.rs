//! Which frames of a stack say nothing about who allocated: allocator
//! plumbing (the allocating end) and program entry frames (the outer end).
//!
//! # Allocator plumbing
//!
//! A stack's *site* is its innermost frame that is not plumbing, so that a
//! `std::vector` growth or a Rust `Vec::push` is charged to the code that
//! grew the vector, as heaptrack charges it, not to `operator new` or
//! `alloc::raw_vec::finish_grow`. The trace keeps every frame; the
//! skipped ones are named in the site's `via`. A frame is plumbing when:
//!
//! * **C++**: its name starts with `operator new` or `operator delete`
//!   (every overload: `new[]`, aligned, nothrow), `std::` or `__gnu_cxx::`
//!   (the standard library's allocators, containers and strings), or is
//!   `__cxa_allocate_exception` (the site is the `throw`); or its source
//!   file is a libstdc++/libc++ header (`/include/c++/`, `/c++/v1/`), which
//!   catches inlined frames whose DWARF name has no namespace
//!   (`allocate`, `_M_realloc_insert<int const&>`).
//! * **Rust**: `__rust_alloc`, `__rust_alloc_zeroed`, `__rust_realloc`,
//!   `__rdl_*`, `__rg_*`, `__rust_no_alloc_shim_is_unstable` (the global
//!   allocator shims); a name starting with `alloc::` or `<alloc::` (Box,
//!   Vec, String, RawVec growth), `std::alloc::`, `<std::alloc::`,
//!   `std::sys::alloc::`, `std::sys::pal::unix::alloc::`, `hashbrown::raw::`
//!   (the std HashMap's table growth), `core::` or `<core::` (core never
//!   allocates itself: its frames are formatting or iterator machinery
//!   between the caller and `alloc`, as in `format!`), or a trait method of
//!   `alloc` (`<str as alloc::string::ToString>::to_string`: ` as alloc::`
//!   inside the leading `<...>`); or its source file is in Rust's
//!   `library/alloc/`, `library/core/` or `library/std/src/alloc.rs` /
//!   `library/std/src/sys/alloc/` (inlined frames of a release build with
//!   line tables are named only `alloc` or `grow_one`).
//! * **C**: the malloc family itself (`malloc`, `calloc`, `realloc`,
//!   `reallocarray`, `posix_memalign`, `aligned_alloc`, `memalign`,
//!   `valloc`, `pvalloc`, `__libc_*` of them), functions that return memory
//!   to free (`strdup`, `strndup`, `wcsdup`, `__strdup`, `__strndup`), and
//!   the common checked wrappers by exact name: `xmalloc`, `xcalloc`,
//!   `xrealloc`, `xzalloc`, `xstrdup`, `xstrndup`, `xmemdup`, `xnmalloc`,
//!   `xcharalloc` (gnulib, libiberty, git), `g_malloc`, `g_malloc0`,
//!   `g_realloc`, `g_try_malloc`, `g_try_malloc0`, `g_malloc_n`,
//!   `g_malloc0_n`, `g_realloc_n`, `g_strdup`, `g_memdup2`, `g_slice_alloc`,
//!   `g_slice_alloc0` (GLib). Exact names only: a function of yours named
//!   `xmalloc_table` is not plumbing.
//! * **Custom heaps**: the reporting calls of the custom allocator API
//!   (`AHeapProfile_reportAllocation`, `AHeapProfile_reportSample`: the
//!   client's or `heapprofd.h`'s inlined wrapper) and the `heapprofd-api`
//!   crate (`heapprofd_api::`, or `report_allocation` / `report_sample`
//!   in the crate's `src/lib.rs`, as line tables name them): the site is
//!   the allocator's function that reported.
//!
//! When every frame is plumbing (the standard library allocating for itself
//! at start-up), the site is the outermost plumbing frame, the closest
//! thing to an entry into the library.
//!
//! # Entry frames
//!
//! Frames that are on (nearly) every stack of a thread and tell nothing:
//! `_start`, `__libc_start_main`, `__libc_start_main_impl`,
//! `__libc_start_call_main`, `start_thread`, `clone`, `clone3`,
//! `__clone`, `__clone3`, `__GI___clone3`, and Rust's runtime entries
//! `std::rt::lang_start*`, `std::rt::lang_start_internal*`,
//! `std::sys::backtrace::__rust_begin_short_backtrace`, the thread
//! trampolines `std::sys::pal::unix::thread::Thread::new::thread_start`
//! and `core::ops::function::FnOnce::call_once`. The inclusive table leaves
//! them out, and also any function on every stack of the heap (a 100%
//! line says nothing, `main` of a single-threaded program included); the
//! report names what it left out.

use heapprofd_model::trace::{Frame, ResolvedFrame};

const PLUMBING_PREFIXES: &[&str] = &[
    "operator new",
    "operator delete",
    "std::",
    "__gnu_cxx::",
    "heapprofd_api::",
    "alloc::",
    "<alloc::",
    "<std::alloc::",
    "core::",
    "<core::",
    "hashbrown::raw::",
    "__rdl_",
    "__rg_",
];

const PLUMBING_NAMES: &[&str] = &[
    "__cxa_allocate_exception",
    "__rust_alloc",
    "__rust_alloc_zeroed",
    "__rust_realloc",
    "__rust_no_alloc_shim_is_unstable",
    "malloc",
    "calloc",
    "realloc",
    "reallocarray",
    "posix_memalign",
    "aligned_alloc",
    "memalign",
    "valloc",
    "pvalloc",
    "__libc_malloc",
    "__libc_calloc",
    "__libc_realloc",
    "__libc_memalign",
    "__libc_valloc",
    "__libc_pvalloc",
    "strdup",
    "strndup",
    "wcsdup",
    "__strdup",
    "__strndup",
    "xmalloc",
    "xcalloc",
    "xrealloc",
    "xzalloc",
    "xstrdup",
    "xstrndup",
    "xmemdup",
    "xnmalloc",
    "xcharalloc",
    "g_malloc",
    "g_malloc0",
    "g_realloc",
    "g_try_malloc",
    "g_try_malloc0",
    "g_malloc_n",
    "g_malloc0_n",
    "g_realloc_n",
    "g_strdup",
    "g_memdup2",
    "g_slice_alloc",
    "g_slice_alloc0",
    "AHeapProfile_reportAllocation",
    "AHeapProfile_reportSample",
];

const PLUMBING_SOURCES: &[&str] = &[
    "/include/c++/",
    "/c++/v1/",
    "library/alloc/src/",
    "library/core/src/",
    "library/std/src/alloc.rs",
    "library/std/src/sys/alloc/",
];

/// The name without a trailing `(...)` parameter list or ` [clone .cold]`.
fn bare(name: &str) -> &str {
    let n = name.split(" [clone").next().unwrap_or(name);
    n.split('(').next().unwrap_or(n)
}

/// Whether `f` is allocator plumbing (see the module docs).
pub fn is_allocator_frame(f: &ResolvedFrame) -> bool {
    if let Some(src) = f.source_file.as_deref()
        && PLUMBING_SOURCES.iter().any(|s| src.contains(s))
    {
        return true;
    }
    let Some(name) = f.function.as_deref() else {
        return false;
    };
    if PLUMBING_PREFIXES.iter().any(|p| name.starts_with(p)) {
        // `std::` is also Rust's std: its allocator shims are plumbing,
        // and so is the rest of it (collections, io), like C++'s.
        return true;
    }
    if name.starts_with('<')
        && let Some(close) = qualified_self_end(name)
        && name[..close].contains(" as alloc::")
    {
        return true;
    }
    PLUMBING_NAMES.contains(&bare(name)) || is_api_report(name, f.source_file.as_deref())
}

/// The `heapprofd-api` crate's reporting methods, which a build with line
/// tables names without their path: by name and file (the crate's
/// `src/lib.rs`, in this workspace or unpacked from a registry).
fn is_api_report(name: &str, source: Option<&str>) -> bool {
    let Some(src) = source else { return false };
    let api_file = src.ends_with("/api/src/lib.rs")
        || (src.contains("/heapprofd-api-") && src.ends_with("/src/lib.rs"));
    api_file && (bare(name).ends_with("report_allocation") || bare(name).ends_with("report_sample"))
}

/// End of the leading `<Type as Trait>` of a Rust qualified path.
fn qualified_self_end(name: &str) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in name.char_indices() {
        match c {
            '<' => depth += 1,
            '>' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// Index of the frame a stack's allocation is charged to (see the module
/// docs): the innermost frame that is not plumbing, else the outermost one.
pub fn allocating_frame(frames: &[Frame]) -> Option<usize> {
    if frames.is_empty() {
        return None;
    }
    Some(
        (0..frames.len())
            .rev()
            .find(|&i| !is_allocator_frame(&frames[i]))
            .unwrap_or(0),
    )
}

const ENTRY_NAMES: &[&str] = &[
    "_start",
    "__libc_start_main",
    "__libc_start_main_impl",
    "__libc_start_call_main",
    "start_thread",
    "clone",
    "clone3",
    "__clone",
    "__clone3",
    "__GI___clone3",
    "std::sys::backtrace::__rust_begin_short_backtrace",
    "std::sys::pal::unix::thread::Thread::new::thread_start",
    "core::ops::function::FnOnce::call_once",
];

/// Whether `f` is a program or thread entry frame (see the module docs).
pub fn is_entry_frame(f: &ResolvedFrame) -> bool {
    let Some(name) = f.function.as_deref() else {
        return false;
    };
    let b = bare(name);
    ENTRY_NAMES.contains(&b) || b.starts_with("std::rt::lang_start")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(name: &str) -> Frame {
        std::sync::Arc::new(ResolvedFrame {
            function: Some(name.to_owned()),
            ..ResolvedFrame::default()
        })
    }

    fn at(name: &str, file: &str) -> Frame {
        std::sync::Arc::new(ResolvedFrame {
            source_file: Some(file.to_owned()),
            ..ResolvedFrame::clone(&frame(name))
        })
    }

    #[test]
    fn cxx_growth_is_charged_to_the_caller() {
        let cxx = [
            frame("main"),
            frame("grow_cache"),
            frame("std::vector<int, std::allocator<int> >::_M_realloc_insert<int const&>"),
            at("allocate", "/usr/include/c++/12/bits/new_allocator.h"),
            frame("operator new(unsigned long)"),
        ];
        assert_eq!(allocating_frame(&cxx), Some(1));
        let throw = [frame("parse"), frame("__cxa_allocate_exception")];
        assert_eq!(allocating_frame(&throw), Some(0));
    }

    #[test]
    fn rust_growth_is_charged_to_the_caller() {
        let rust = [
            frame("app::load"),
            at("grow_one", "/rustc/abc/library/alloc/src/raw_vec.rs"),
            at("alloc", "/rustc/abc/library/alloc/src/alloc.rs"),
            frame("alloc::raw_vec::finish_grow"),
            frame("__rust_alloc"),
        ];
        assert_eq!(allocating_frame(&rust), Some(0));
        let to_string = [
            frame("app::name"),
            frame("<str as alloc::string::ToString>::to_string"),
        ];
        assert_eq!(allocating_frame(&to_string), Some(0));
        let format = [
            frame("make_strings"),
            frame("alloc::fmt::format::format_inner"),
            frame("core::fmt::write"),
            frame("<core::fmt::Formatter>::padding"),
            frame("<alloc::string::String as core::fmt::Write>::write_str"),
            frame("__rust_alloc"),
        ];
        assert_eq!(allocating_frame(&format), Some(0));
        let own = [frame("<app::Cache as app::Grow>::grow")];
        assert!(!is_allocator_frame(&own[0]));
    }

    #[test]
    fn c_wrappers_by_exact_name() {
        assert_eq!(
            allocating_frame(&[frame("main"), frame("xmalloc")]),
            Some(0)
        );
        assert_eq!(allocating_frame(&[frame("main"), frame("strdup")]), Some(0));
        assert!(!is_allocator_frame(&frame("xmalloc_table")));
        assert!(!is_allocator_frame(&frame("my_malloc")));
        // A plain C caller of malloc is its own site.
        assert_eq!(allocating_frame(&[frame("main"), frame("leak")]), Some(1));
    }

    #[test]
    fn all_plumbing_or_nameless() {
        let all = [
            frame("std::locale::locale()"),
            frame("std::locale::_Impl::_Impl(unsigned long)"),
            frame("operator new(unsigned long)"),
        ];
        assert_eq!(allocating_frame(&all), Some(0), "the outermost");
        assert_eq!(allocating_frame(&[Frame::default()]), Some(0));
        assert_eq!(allocating_frame(&[]), None);
    }

    #[test]
    fn entry_frames() {
        for n in [
            "_start",
            "__libc_start_call_main",
            "start_thread",
            "clone3",
            "std::rt::lang_start_internal",
            "std::rt::lang_start::{{closure}}",
        ] {
            assert!(is_entry_frame(&frame(n)), "{n}");
        }
        assert!(!is_entry_frame(&frame("main")));
        assert!(!is_entry_frame(&frame("worker")));
    }
}
