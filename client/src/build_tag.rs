//! The build tag of the shared contracts (`heapprofd_proto::BUILD_TAG`) in
//! the library's `.heapprofd_rs_build` section, for the system-wide
//! `heapprofd-rs install` to refuse a library from another build (the
//! daemon's `install/build_tag.rs` reads it from the file; the
//! `install_layout` test with readelf). Nothing reads it at run time.

use heapprofd_proto::BUILD_TAG;

const TAG: &[u8] = BUILD_TAG.as_bytes();

const fn to_array<const N: usize>(s: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    let mut i = 0;
    while i < N {
        a[i] = s[i];
        i += 1;
    }
    a
}

// The section name is `heapprofd_proto::BUILD_TAG_SECTION`; `#[used]` keeps
// the static (and its section) although nothing refers to it.
const _: () = assert!(matches!(
    heapprofd_proto::BUILD_TAG_SECTION.as_bytes(),
    b".heapprofd_rs_build"
));
#[used]
#[unsafe(link_section = ".heapprofd_rs_build")]
static BUILD_TAG_BYTES: [u8; TAG.len()] = to_array(TAG);
