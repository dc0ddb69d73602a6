//! Maps kept for after a process exits.
//!
//! A process's maps are read again when a sample has a pc in no known
//! mapping (an object loaded since the last read). After the process has
//! exited they read as empty, and such samples would be cut. So the daemon
//! keeps the maps read just before the exit ([`KeptMaps`], filled when the
//! exiting client asks, see the shared memory's `maps_ask`), and the
//! process's maps source is [`LiveOrKept`]: the live maps while the process
//! has any, the kept ones after.
//!
//! The kept text is the process's last state, so it holds every object
//! still loaded at its end; one unloaded earlier is handled before it goes
//! (the client's `dlclose` barrier), so no sample needs it afterwards.

use std::io;
use std::sync::{Arc, Mutex, PoisonError};

use crate::memory::MapsSource;

/// The maps text read for a process just before it exited, shared by the
/// thread that reads it and the process's [`LiveOrKept`].
#[derive(Debug, Clone, Default)]
pub struct KeptMaps(Arc<Mutex<Option<Arc<str>>>>);

impl KeptMaps {
    /// Keeps `text` (replacing what was kept); empty text is not kept.
    pub fn keep(&self, text: String) {
        if text.is_empty() {
            return;
        }
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(text.into());
    }

    /// The text kept, if any.
    pub fn get(&self) -> Option<Arc<str>> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// A process's maps: `live` while they read as something, else the kept
/// text (if any).
pub struct LiveOrKept {
    live: Box<dyn MapsSource>,
    kept: KeptMaps,
}

impl std::fmt::Debug for LiveOrKept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveOrKept")
            .field("kept", &self.kept)
            .finish_non_exhaustive()
    }
}

impl LiveOrKept {
    /// Reads `live`, falling back to `kept`.
    pub fn new(live: Box<dyn MapsSource>, kept: KeptMaps) -> Self {
        LiveOrKept { live, kept }
    }
}

impl MapsSource for LiveOrKept {
    fn read_maps(&mut self) -> io::Result<String> {
        let live = self.live.read_maps();
        if matches!(&live, Ok(t) if !t.is_empty()) {
            return live;
        }
        match self.kept.get() {
            Some(text) => Ok(text.to_string()),
            None => live,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::StaticMaps;

    struct Failing;
    impl MapsSource for Failing {
        fn read_maps(&mut self) -> io::Result<String> {
            Err(io::Error::from_raw_os_error(libc::ESRCH))
        }
    }

    #[test]
    fn live_maps_while_there_are_any_then_the_kept_ones() {
        let kept = KeptMaps::default();
        let line = "7f0000000000-7f0000001000 r-xp 00000000 08:01 42 /lib/x.so\n";
        let mut alive = LiveOrKept::new(Box::new(StaticMaps(line.into())), kept.clone());
        let mut gone = LiveOrKept::new(Box::new(StaticMaps(String::new())), kept.clone());
        let mut failing = LiveOrKept::new(Box::new(Failing), kept.clone());
        // Nothing kept: what the live source says.
        assert_eq!(gone.read_maps().unwrap(), "");
        assert!(failing.read_maps().is_err());
        kept.keep(String::new());
        assert!(kept.get().is_none(), "empty text is not kept");
        kept.keep("at exit\n".into());
        assert_eq!(alive.read_maps().unwrap(), line, "live first");
        assert_eq!(gone.read_maps().unwrap(), "at exit\n");
        assert_eq!(failing.read_maps().unwrap(), "at exit\n");
    }
}
