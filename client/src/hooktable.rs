//! The hook tables: every hooked function, one record each.
//!
//! [`HOOKS`] are the functions whose GOT slots a patched session redirects
//! (the malloc family, C++ `operator new`/`delete` when they are recorded,
//! `dlopen` and `dlclose`); [`FORWARDED`] are exported and forwarded but never
//! patched (`malloc_usable_size`: a program that reaches the allocator's
//! directly gets the same answer; the exec family, `pthread_create`,
//! `_exit` and `_Exit`, which matter only for a preloaded client).
//! `originals` resolves both.

use crate::hook::Hook;
use crate::{atexit, cxxhooks as cxx, dlclosehook, dlhook, exechooks as exec, hooks, threadhook};

/// Every function GOT patching may redirect.
pub(crate) static HOOKS: [&Hook; 32] = [
    &hooks::MALLOC,
    &hooks::FREE,
    &hooks::CALLOC,
    &hooks::REALLOC,
    &hooks::REALLOCARRAY,
    &hooks::POSIX_MEMALIGN,
    &hooks::MEMALIGN,
    &hooks::ALIGNED_ALLOC,
    &hooks::VALLOC,
    &hooks::PVALLOC,
    &cxx::NEW,
    &cxx::NEW_ARRAY,
    &cxx::NEW_ALIGNED,
    &cxx::NEW_ARRAY_ALIGNED,
    &cxx::NEW_NOTHROW,
    &cxx::NEW_ARRAY_NOTHROW,
    &cxx::NEW_ALIGNED_NOTHROW,
    &cxx::NEW_ARRAY_ALIGNED_NOTHROW,
    &cxx::DELETE,
    &cxx::DELETE_ARRAY,
    &cxx::DELETE_SIZED,
    &cxx::DELETE_ARRAY_SIZED,
    &cxx::DELETE_NOTHROW,
    &cxx::DELETE_ARRAY_NOTHROW,
    &cxx::DELETE_ALIGNED,
    &cxx::DELETE_ARRAY_ALIGNED,
    &cxx::DELETE_SIZED_ALIGNED,
    &cxx::DELETE_ARRAY_SIZED_ALIGNED,
    &cxx::DELETE_ALIGNED_NOTHROW,
    &cxx::DELETE_ARRAY_ALIGNED_NOTHROW,
    &dlhook::DLOPEN,
    &dlclosehook::DLCLOSE,
];

/// Exported, forwarded, never patched.
pub(crate) static FORWARDED: [&Hook; 17] = [
    &hooks::MALLOC_USABLE_SIZE,
    &exec::EXECVE,
    &exec::EXECVEAT,
    &exec::FEXECVE,
    &exec::EXECVPE,
    &exec::EXECV,
    &exec::EXECVP,
    &exec::POSIX_SPAWN,
    &exec::POSIX_SPAWNP,
    &exec::SYSTEM,
    &exec::POPEN,
    &exec::EXECL_REC,
    &exec::EXECLE_REC,
    &exec::EXECLP_REC,
    &threadhook::PTHREAD_CREATE,
    &atexit::EXIT,
    &atexit::EXIT_C99,
];
