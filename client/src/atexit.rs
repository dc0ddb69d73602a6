//! The library's destructor: what the client does when the process exits
//! through `exit` (it runs after the program's own destructors, which may
//! still allocate and free: the client was loaded first, so it is
//! finalized last). A process that ends with `_exit` or a signal skips it.

#[cfg(not(test))]
#[used]
#[unsafe(link_section = ".fini_array")]
static DESTRUCTOR: extern "C" fn() = destructor;

/// At exit: the heaps of the running session are disabled, the samples
/// threads lost since their last sample are sent, and, if objects were
/// loaded since the handshake, the daemon reads our maps before they are
/// gone (`mapsask`).
#[cfg_attr(test, allow(dead_code))]
extern "C" fn destructor() {
    heapprofd_client_core::heaps::at_exit();
    heapprofd_client_core::stacksample::send_losses_at_exit();
    heapprofd_client_core::mapsask::before_image_ends();
}
