//! Fuzz target: the wire decoder. Decoding arbitrary bytes must never panic,
//! and whatever decodes must encode back to bytes that decode to the same value.

#![no_main]

use heapprofd_proto::wire::{ClientConfig, Handshake, Record};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(rec) = Record::decode(data) {
        let bytes = rec.encode_to_vec();
        assert_eq!(Record::decode(&bytes), Ok(rec), "record round trip");
    }
    if let Ok(h) = Handshake::decode(data) {
        assert_eq!(
            Handshake::decode(&h.encode()),
            Ok(h),
            "handshake round trip"
        );
    }
    if let Ok(c) = ClientConfig::decode(data) {
        assert_eq!(
            ClientConfig::decode(&c.encode()),
            Ok(c),
            "config round trip"
        );
    }
});
