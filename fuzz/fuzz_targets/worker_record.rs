//! Fuzz target: a worker's per-record step (`SessionUnwinder::handle_record`)
//! on arbitrary ring-buffer records, with no thread, channel or foreign
//! `/proc`: the process model is a static copy of this binary's own
//! mappings, moved to a fixed address so that seeds keep meaning the same
//! code from run to run, and its memory cannot be read (only the copied
//! stack in the record is).
//!
//! The input is a sequence of records, each `[u16 length][bytes]`. The
//! state (stack caches, replay memo) lives on across inputs, as it does
//! for a session. Nothing may panic; every malloc operation must use a
//! stack id defined before it (the scratch id right before it), and the
//! operations go on into the bookkeeping, which must take them.

#![no_main]

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use heapprofd_daemon::runtime::session_unwinder::SessionUnwinder;
use heapprofd_daemon::runtime::stacks::InternCtx;
use heapprofd_daemon::runtime::symbolize::Symbolizer;
use heapprofd_fuzz::Input;
use heapprofd_model::bookkeeping::Bookkeeping;
use heapprofd_model::messages::{Op, SCRATCH_STACK, SessionEvent};
use heapprofd_model::profile::Interner;
use heapprofd_unwinder::{ModuleCache, NoMemory, ProcessContext, StaticMaps};
use libfuzzer_sys::fuzz_target;

/// Where this binary's mappings are moved to in the process model.
pub const FIXED_BASE: u64 = 0x5555_0000_0000;
/// Inputs between resets of the bookkeeping (its live table would grow).
const BOOK_RESET: u32 = 10_000;

struct State {
    unwinder: SessionUnwinder,
    interner: Arc<Interner>,
    symbolizer: Symbolizer,
    defined: HashSet<u32>,
    book: Bookkeeping,
    inputs: u32,
}

/// This binary's mappings from `/proc/self/maps`, moved so that the first
/// one starts at [`FIXED_BASE`].
fn fixed_maps() -> String {
    let exe = std::fs::read_link("/proc/self/exe").expect("/proc/self/exe");
    let exe = exe.to_string_lossy();
    let text = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
    let mut base = None;
    let mut out = String::new();
    for line in text.lines().filter(|l| l.ends_with(&*exe)) {
        let (range, rest) = line.split_once(' ').expect("a maps line");
        let (s, e) = range.split_once('-').expect("a range");
        let s = u64::from_str_radix(s, 16).expect("hex");
        let e = u64::from_str_radix(e, 16).expect("hex");
        let b = *base.get_or_insert(s);
        let shift = |a: u64| a - b + FIXED_BASE;
        out.push_str(&format!("{:x}-{:x} {rest}\n", shift(s), shift(e)));
    }
    out
}

fn new_book(interner: &Interner) -> Bookkeeping {
    let mut book = Bookkeeping::new(interner, 4096);
    book.handle(SessionEvent::Started {
        id: 1,
        pid: 1,
        cmdline: Vec::new(),
        from_startup: true,
        started_ns: 0,
        identity: Default::default(),
        memory: None,
    });
    book
}

fn state() -> &'static Mutex<State> {
    static STATE: std::sync::OnceLock<Mutex<State>> = std::sync::OnceLock::new();
    STATE.get_or_init(|| {
        let process = ProcessContext::new(
            1,
            Box::new(StaticMaps(fixed_maps())),
            Box::new(NoMemory),
            Arc::new(ModuleCache::default()),
        );
        let interner = Arc::new(Interner::new());
        Mutex::new(State {
            unwinder: SessionUnwinder::new(process, 0..0, 1),
            book: new_book(&interner),
            interner,
            symbolizer: Symbolizer::new(),
            defined: HashSet::new(),
            inputs: 0,
        })
    })
}

fuzz_target!(|data: &[u8]| {
    let mut guard = state().lock().unwrap_or_else(|e| e.into_inner());
    let st = &mut *guard;
    let mut input = Input::new(data);
    let mut ops = Vec::new();
    {
        let cx = InternCtx {
            interner: &st.interner,
            symbolizer: &st.symbolizer,
            symbolize: false,
        };
        let mut scratch = Vec::new();
        while !input.is_empty() {
            let len = usize::from(input.u16());
            let record = input.bytes(len);
            st.unwinder.handle_record(record, &mut scratch, &mut ops, &cx);
        }
    }
    let mut previous: Option<&Op> = None;
    for op in &ops {
        match op {
            Op::Stack { id, frames } => {
                assert!(!frames.is_empty(), "a stack has at least its error frame");
                st.defined.insert(*id);
            }
            Op::Malloc { stack, .. } | Op::StackSample { stack, .. } => {
                assert!(
                    st.defined.contains(stack),
                    "stack {stack} used before it was defined"
                );
                if *stack == SCRATCH_STACK {
                    assert!(
                        matches!(
                            previous,
                            Some(Op::Stack {
                                id: SCRATCH_STACK,
                                ..
                            })
                        ),
                        "the scratch stack is redefined right before each use"
                    );
                }
            }
            Op::Free { .. }
            | Op::HeapName { .. }
            | Op::Context { .. }
            | Op::SampleLosses { .. }
            | Op::EventName { .. } => {}
        }
        previous = Some(op);
    }
    st.inputs += 1;
    if st.inputs.is_multiple_of(BOOK_RESET) {
        st.book = new_book(&st.interner);
    }
    st.book.handle(SessionEvent::Ops {
        id: 1,
        ops,
        stats: st.unwinder.stats(),
    });
});
