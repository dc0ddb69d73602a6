//! The hook table: every function whose GOT slots a patched session
//! redirects, one record each (the malloc family and `dlopen`;
//! `malloc_usable_size` is exported but never patched: a program that
//! reaches glibc's directly gets the same answer).

use crate::hook::Hook;
use crate::{dlhook, hooks};

/// Every hooked function.
pub(crate) static HOOKS: [&Hook; 11] = [
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
    &dlhook::DLOPEN,
];
