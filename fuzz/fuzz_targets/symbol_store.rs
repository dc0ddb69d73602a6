//! Fuzz target: the symbol store's file decoder (`record`'s symbol cache,
//! files anyone who can write the cache directory could have made). Any
//! bytes, given a right checksum, must decode or be refused without a
//! panic, within the decoder's bounds, and what decodes must round-trip.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    heapprofd_unwinder::fuzz_symbol_store_decode(data);
});
