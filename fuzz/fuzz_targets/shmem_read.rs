//! Fuzz target: the ring-buffer reader attached to memory a hostile writer
//! filled. The fuzzer input becomes the shared metadata (positions, lock,
//! flags) and the data area (record headers and payloads), and is also
//! replayed as a script of further writes between reads, so values change
//! while the reader works. The reader must never panic, read out of bounds,
//! or loop without end; every record it returns must lie inside the buffer.

#![no_main]

use std::sync::OnceLock;

use heapprofd_fuzz::split_prefix;
use heapprofd_shmem::{ReadOutcome, RingBuffer, offsets};
use libfuzzer_sys::fuzz_target;

const DATA_SIZE: usize = 4096;

fn ring() -> &'static RingBuffer {
    static RING: OnceLock<RingBuffer> = OnceLock::new();
    RING.get_or_init(|| RingBuffer::create(DATA_SIZE as u64).expect("create ring").0)
}

fuzz_target!(|data: &[u8]| {
    let rb = ring();
    let (meta, area) = rb.raw_parts_for_testing();
    let meta_len = RingBuffer::metadata_len();
    // Metadata: the first bytes of input, positions included.
    let (m, rest): ([u8; 192], &[u8]) = split_prefix(data);
    // SAFETY: the metadata page and the data area are mapped and at least
    // this large; we play the hostile peer writing raw bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(m.as_ptr(), meta, meta_len.min(m.len()));
        std::ptr::write_bytes(area, 0, DATA_SIZE);
        let n = rest.len().min(DATA_SIZE);
        std::ptr::copy_nonoverlapping(rest.as_ptr(), area, n);
    }
    let mut reader = rb.reader();
    let mut buf = Vec::new();
    // Interleave reads with writes of new positions taken from the input.
    let mut script = rest.chunks_exact(9);
    for _ in 0..64 {
        match reader.read(&mut buf) {
            ReadOutcome::Record(n) => assert!(n == buf.len() && n < DATA_SIZE),
            ReadOutcome::Corrupt(_) => {}
            ReadOutcome::Empty | ReadOutcome::Pending => {}
        }
        if let Some(step) = script.next() {
            let v = u64::from_le_bytes(step[1..9].try_into().unwrap());
            // SAFETY: writing inside the mapped metadata page or data area.
            unsafe {
                match step[0] % 3 {
                    0 => meta.add(offsets::WRITE_POS).cast::<u64>().write_volatile(v),
                    1 => meta.add(offsets::READ_POS).cast::<u64>().write_volatile(v),
                    _ => area
                        .add((v as usize % (DATA_SIZE / 8)) * 8)
                        .cast::<u64>()
                        .write_volatile(v >> 3),
                }
            }
        }
    }
});
