//! A multi-writer, single-reader ring buffer of variable-size records in a
//! sealed memfd, shared by the heapprofd-rs client (writers: the profiled
//! program's threads) and the daemon (the reader).
//!
//! Use it as follows:
//! 1. The daemon calls [`RingBuffer::create`] and sends the returned memfd to
//!    the client, which maps it with [`RingBuffer::attach`].
//! 2. A writer calls [`RingBuffer::begin_write`], fills the [`Reservation`]
//!    and commits it; then, if [`RingBuffer::take_reader_paused`] says the
//!    reader sleeps, it wakes the reader (the client pokes a socket).
//! 3. The reader drains records with [`Reader::read`]. When it finds nothing
//!    it calls [`RingBuffer::pause_reader`], reads once more, and sleeps only
//!    if that read is still empty, and never longer than a polling period:
//!    the wake-up protocol has no fence on the writer's side, so a rare
//!    race can leave a record unannounced until the next poll.
//! 4. Before the process unloads an object, a writer waits for the reader to
//!    consume what was written ([`RingBuffer::wait_consumed`]) and then bumps
//!    the unload epoch ([`RingBuffer::note_unload`]); see `drain`.
//! 5. Before the process exits with objects loaded since the handshake, a
//!    writer asks the daemon to read and keep its maps
//!    ([`RingBuffer::ask_maps`]) and waits for [`RingBuffer::maps_kept`];
//!    see `maps_ask`.
//!
//! # Guarantees
//! * Records are committed atomically: the header, written last with release
//!   ordering, makes a record visible; the reader never sees half a record.
//! * A record never wraps: the data area is mapped twice back to back.
//! * Writers reserve space under a spinlock in shared memory; a writer that
//!   waits more than a second poisons it, so a dead or stuck writer cannot
//!   hang the others. When the buffer is full a writer drops the record
//!   ([`WriteMode::Drop`]) or waits up to a timeout ([`WriteMode::Block`]).
//! * **The reader trusts nothing in the shared memory.** Any positions,
//!   sizes or flags, changed at any moment by the other side, produce a
//!   counted [`ReadOutcome::Corrupt`], never undefined behaviour, a panic, an
//!   out-of-bounds access or an endless loop. The fuzz target `shmem_read`
//!   checks this.

#![warn(missing_docs)]

mod drain;
mod layout;
mod mapping;
mod maps_ask;
mod prefetch;
mod reader;
mod ring;
mod ring_record;
mod stack_resync;
mod writer;

pub use drain::Drain;
pub use layout::{ClientError, RECORD_HEADER_LEN, offsets, record_size, used_bytes};
pub use mapping::{MAX_DATA_SIZE, SetupError, check_data_size, page_size};
pub use prefetch::prefetch_for_write;
pub use reader::{Corruption, InPlace, ReadOutcome, Reader};
pub use ring::{RingBuffer, Stats};
pub use ring_record::{RecordBytes, RingRecord};
pub use writer::{Reservation, WriteError, WriteMode};
