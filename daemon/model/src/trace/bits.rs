//! A growable bit set the trace writer keeps of the interned entries it
//! already wrote.

/// Growable bit set indexed by 1-based ids.
#[derive(Debug, Default)]
pub(super) struct Bits(Vec<u64>);

impl Bits {
    /// Sets `id`; whether it was not set.
    pub(super) fn insert(&mut self, id: u32) -> bool {
        let (w, b) = ((id / 64) as usize, id % 64);
        if self.0.len() <= w {
            self.0.resize(w + 1, 0);
        }
        let new = self.0[w] & (1 << b) == 0;
        self.0[w] |= 1 << b;
        new
    }

    /// Whether `id` is set.
    pub(super) fn contains(&self, id: u32) -> bool {
        self.0
            .get((id / 64) as usize)
            .is_some_and(|w| w & (1 << (id % 64)) != 0)
    }
}
