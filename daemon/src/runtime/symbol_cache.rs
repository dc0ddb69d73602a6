//! The daemon's end of the symbol cache (`record --symbol-cache DIR`):
//! what to do with the answers found in a run when it ends. The store itself
//! (its files, checks and budget) is `heapprofd_unwinder::SymbolStore`.

use std::time::Instant;

use heapprofd_unwinder::ModuleCache;

/// Writes the symbolization answers found in this run to the symbol
/// store (a warning if it cannot: the trace is not affected).
pub(super) fn persist(cache: &ModuleCache) {
    let Some(store) = cache.symbolize_options().store.as_ref() else {
        return;
    };
    let t0 = Instant::now();
    let (written, error) = cache.persist_symbols();
    // A cache this user may not write (another user's HOME) is not
    // worth a warning at every run; anything else (a full disk) is.
    let quiet = error.as_ref().is_some_and(|e| {
        matches!(
            e.kind(),
            std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem
        )
    });
    if let Some(e) = error.filter(|_| !quiet) {
        log::warn!(
            "cannot write the symbol cache {}: {e} (the trace is complete; \
             --no-symbol-cache turns the cache off)",
            store.dir().display()
        );
    }
    log::debug!(
        "symbol cache {}: {written} module files written in {:.1} ms",
        store.dir().display(),
        t0.elapsed().as_secs_f64() * 1e3
    );
}
