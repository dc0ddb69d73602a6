//! The unwinder's mappings, interned as the model's.

use heapprofd_model::profile::{Interner, Mapping, MappingId};

/// Interns a mapping of the unwinder's process model.
pub fn intern_mapping(interner: &Interner, m: &heapprofd_unwinder::Mapping) -> MappingId {
    interner.intern_mapping(&Mapping {
        path: m.path.as_bytes(),
        build_id: m.build_id.as_deref(),
        start: m.start,
        end: m.end,
        exact_offset: m.offset,
        start_offset: m.start_offset,
        load_bias: m.load_bias,
    })
}
