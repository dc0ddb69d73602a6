/* heapprofd.h: the custom allocator API, the user context API and the
 * stack-request API of heapprofd-rs.
 *
 * A program with its own allocator (a pool, an arena, a GC heap) reports
 * what it hands out into named heaps; `heapprofd-rs record --heaps NAME`
 * (or --all-heaps) profiles them, each with its own sampling interval, as
 * its own profile in the trace. The names and signatures are those of
 * Perfetto's heap_profile.h, so code written for Android's heapprofd
 * builds against this header unchanged.
 *
 * Linking: nothing. Every function here is a static inline wrapper that
 * looks the real one up in libheapprofd_client.so at run time with
 * dlsym(RTLD_DEFAULT, ...), once per translation unit (glibc >= 2.34 has
 * dlsym in libc; older ones need -ldl). When the client is not loaded
 * every call is a cheap no-op: AHeapInfo_create returns NULL,
 * AHeapProfile_registerHeap returns 0, the reports return false.
 *
 * Why dlsym and not weak symbols: a weak undefined reference in a non-PIE
 * executable is resolved to 0 by the static linker, so the API would be
 * silently dead there; dlsym works for every kind of executable and
 * library, and it is also how the Rust crate (heapprofd-api) finds the
 * functions, so both behave alike. The lookup happens on the first call
 * (normally AHeapInfo_create at start-up); a call made while that lookup
 * is running on the same thread (dlsym allocated, and the allocation was
 * reported) is a no-op. After it, a call costs a load and a branch, plus
 * the client's own work: a load of the session's state when no profile
 * records the heap.
 *
 * The client is found when it was preloaded (`record -- CMD`, `record -n`
 * with LD_PRELOAD, a dormant preloaded client woken by `record --pid`). A
 * client injected into a running program by ptrace is not in the global
 * scope, so the API stays a no-op there.
 *
 * Semantics:
 *  - Names are 1 to 63 bytes (HEAPPROFD_HEAP_NAME_SZ with its NUL); at
 *    most 256 heaps per process; ids start at 1 (the malloc family is the
 *    built-in heap "libc.malloc").
 *  - A heap may be registered before a profile starts or while one runs;
 *    its enabled callback runs when a profile starts recording it (the
 *    callback info gives the heap's sampling interval), its disabled
 *    callback when that profile ends and at exit. Callbacks run on a
 *    thread of the client or in the registering thread; what they
 *    allocate is not recorded and reports made from them are no-ops.
 *  - AHeapProfile_reportAllocation(heap, id, size) samples like malloc
 *    (Poisson, the heap's interval) and returns whether the allocation was
 *    recorded; AHeapProfile_reportSample records one the program sampled
 *    itself; AHeapProfile_reportFree(heap, id) ends the allocation `id`.
 *    Ids are the program's (usually the address); an id reported again
 *    while live replaces the old allocation.
 *  - The reports never allocate and may be called from any thread, from
 *    inside the program's own allocator, and from signal handlers (a
 *    report interrupting another on the same thread is a no-op).
 *
 * User contexts (heapprofd_context_*): a program labels what its threads
 * allocate with an immutable map of string keys to string values (an
 * endpoint, a request id). Every sample made while a context is installed
 * on the allocating thread carries it: pprof labels, a root frame
 * `key=value` per context in the trace, `report --by KEY`, and
 * `record --context KEY[=VALUE]|any` samples only inside matching ones.
 *  - heapprofd_context_create(parent, keys, values, n): a new context with
 *    `n` pairs extending `parent` (0: the calling thread's current one; its
 *    pairs of the same key are overridden). Keys are 1 to 255 bytes, values
 *    0 to 255, at most 32 pairs and 1 KiB per context, 4095 contexts alive
 *    at once: beyond that (or for a NULL string) the call returns the
 *    overflow context, counted and flagged in the profile. Returns 0
 *    without the client.
 *  - heapprofd_context_activate(id) installs it on the calling thread and
 *    returns a token; heapprofd_context_deactivate(token) puts back what was
 *    installed before (they nest). One thread-local word, a few ns.
 *  - heapprofd_context_current() is the calling thread's context (0: none),
 *    to hand to another thread or task, which activates it there.
 *  - heapprofd_context_release(id): the context is not installed again;
 *    its slot is reused, its id never (within the process).
 *  None of them allocate; activate, deactivate and current are
 *  async-signal-safe.
 *
 * Stack requests: any signal handler may record the stack of the code it
 * interrupted, as a sample of an event the program names.
 *  - heapprofd_register_event(tag, name) names `tag` once (outside
 *    handlers; it also looks the functions up).
 *  - heapprofd_request_stack(ucontext, tag) copies the interrupted
 *    registers and stack into the profile's buffer; the daemon unwinds it
 *    and writes a sample of `tag`'s event (its first frame is the
 *    interrupted pc, not the handler). Async-signal-safe: no allocation,
 *    no lock, errno preserved.
 *
 * The stack-request API, in-process walk (heapprofd_walk_*): the stack of
 * the calling thread, or of the context a signal handler interrupted,
 * walked synchronously in the process and handed to callbacks, for agents
 * that want frames now. See the section below for the details.
 */
#ifndef HEAPPROFD_RS_HEAPPROFD_H
#define HEAPPROFD_RS_HEAPPROFD_H

#include <dlfcn.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of a heap name, its terminating NUL included. */
#define HEAPPROFD_HEAP_NAME_SZ 64

typedef struct AHeapInfo AHeapInfo;
typedef struct AHeapProfileEnableCallbackInfo AHeapProfileEnableCallbackInfo;
typedef struct AHeapProfileDisableCallbackInfo AHeapProfileDisableCallbackInfo;

typedef void (*heapprofd_enabled_callback)(void *data,
                                           const AHeapProfileEnableCallbackInfo *info);
typedef void (*heapprofd_disabled_callback)(void *data,
                                            const AHeapProfileDisableCallbackInfo *info);

/* The client's functions, looked up once per translation unit. */
struct heapprofd_api_fns {
  int state; /* 0 not looked up, 1 looking up, 2 done */
  AHeapInfo *(*create)(const char *);
  AHeapInfo *(*set_enabled)(AHeapInfo *, heapprofd_enabled_callback, void *);
  AHeapInfo *(*set_disabled)(AHeapInfo *, heapprofd_disabled_callback, void *);
  uint32_t (*register_heap)(AHeapInfo *);
  bool (*report_allocation)(uint32_t, uint64_t, uint64_t);
  bool (*report_sample)(uint32_t, uint64_t, uint64_t);
  void (*report_free)(uint32_t, uint64_t);
  uint64_t (*get_interval)(const AHeapProfileEnableCallbackInfo *);
  uint64_t (*context_create)(uint64_t, const char *const *, const char *const *, size_t);
  uint64_t (*context_activate)(uint64_t);
  void (*context_deactivate)(uint64_t);
  uint64_t (*context_current)(void);
  void (*context_release)(uint64_t);
  int (*request_stack)(const void *, uint64_t);
  int (*register_event)(uint64_t, const char *);
};

static struct heapprofd_api_fns heapprofd_api_fns_;

#define HEAPPROFD_API_LOAD_(field, name)                                              \
  __atomic_store_n((void **)&heapprofd_api_fns_.field, dlsym(RTLD_DEFAULT, name), \
                   __ATOMIC_RELAXED)

/* The functions, or NULL while they are being looked up (or absent). */
static inline const struct heapprofd_api_fns *heapprofd_api_(void) {
  int s = __atomic_load_n(&heapprofd_api_fns_.state, __ATOMIC_ACQUIRE);
  if (__builtin_expect(s == 2, 1)) return &heapprofd_api_fns_;
  int expected = 0;
  if (!__atomic_compare_exchange_n(&heapprofd_api_fns_.state, &expected, 1, false,
                                   __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
    return expected == 2 ? &heapprofd_api_fns_ : NULL;
  HEAPPROFD_API_LOAD_(create, "AHeapInfo_create");
  HEAPPROFD_API_LOAD_(set_enabled, "AHeapInfo_setEnabledCallback");
  HEAPPROFD_API_LOAD_(set_disabled, "AHeapInfo_setDisabledCallback");
  HEAPPROFD_API_LOAD_(register_heap, "AHeapProfile_registerHeap");
  HEAPPROFD_API_LOAD_(report_allocation, "AHeapProfile_reportAllocation");
  HEAPPROFD_API_LOAD_(report_sample, "AHeapProfile_reportSample");
  HEAPPROFD_API_LOAD_(report_free, "AHeapProfile_reportFree");
  HEAPPROFD_API_LOAD_(get_interval, "AHeapProfileEnableCallbackInfo_getSamplingInterval");
  HEAPPROFD_API_LOAD_(context_create, "heapprofd_context_create");
  HEAPPROFD_API_LOAD_(context_activate, "heapprofd_context_activate");
  HEAPPROFD_API_LOAD_(context_deactivate, "heapprofd_context_deactivate");
  HEAPPROFD_API_LOAD_(context_current, "heapprofd_context_current");
  HEAPPROFD_API_LOAD_(context_release, "heapprofd_context_release");
  HEAPPROFD_API_LOAD_(request_stack, "heapprofd_request_stack");
  HEAPPROFD_API_LOAD_(register_event, "heapprofd_register_event");
  __atomic_store_n(&heapprofd_api_fns_.state, 2, __ATOMIC_RELEASE);
  return &heapprofd_api_fns_;
}

#define HEAPPROFD_API_FN_(field) \
  (heapprofd_api_() ? __atomic_load_n(&heapprofd_api_fns_.field, __ATOMIC_RELAXED) : NULL)

/* The heap's sampling interval, given to an enabled callback. */
static inline uint64_t AHeapProfileEnableCallbackInfo_getSamplingInterval(
    const AHeapProfileEnableCallbackInfo *info) {
  uint64_t (*f)(const AHeapProfileEnableCallbackInfo *) = HEAPPROFD_API_FN_(get_interval);
  return f ? f(info) : 0;
}

/* A new heap called `heap_name` (1 to 63 bytes); NULL without the client,
 * for a name that does not fit, or beyond 256 heaps. */
static inline AHeapInfo *AHeapInfo_create(const char *heap_name) {
  AHeapInfo *(*f)(const char *) = HEAPPROFD_API_FN_(create);
  return f ? f(heap_name) : NULL;
}

/* `callback(data, info)` runs when a profile starts recording the heap.
 * Returns `info` (NULL for a NULL info). */
static inline AHeapInfo *AHeapInfo_setEnabledCallback(AHeapInfo *info,
                                                      heapprofd_enabled_callback callback,
                                                      void *data) {
  AHeapInfo *(*f)(AHeapInfo *, heapprofd_enabled_callback, void *) =
      HEAPPROFD_API_FN_(set_enabled);
  return f && info ? f(info, callback, data) : NULL;
}

/* `callback(data, info)` runs when that profile ends, and at exit. */
static inline AHeapInfo *AHeapInfo_setDisabledCallback(AHeapInfo *info,
                                                       heapprofd_disabled_callback callback,
                                                       void *data) {
  AHeapInfo *(*f)(AHeapInfo *, heapprofd_disabled_callback, void *) =
      HEAPPROFD_API_FN_(set_disabled);
  return f && info ? f(info, callback, data) : NULL;
}

/* Registers the heap; returns its id (from 1), 0 without the client or for
 * a NULL info. */
static inline uint32_t AHeapProfile_registerHeap(AHeapInfo *info) {
  uint32_t (*f)(AHeapInfo *) = HEAPPROFD_API_FN_(register_heap);
  return f && info ? f(info) : 0;
}

/* An allocation `alloc_id` of `size` bytes in `heap_id`: sampled at the
 * heap's interval; true if it was recorded. */
static inline bool AHeapProfile_reportAllocation(uint32_t heap_id, uint64_t alloc_id,
                                                 uint64_t size) {
  bool (*f)(uint32_t, uint64_t, uint64_t) = HEAPPROFD_API_FN_(report_allocation);
  return f ? f(heap_id, alloc_id, size) : false;
}

/* An allocation the program sampled itself (standing for `size` bytes):
 * recorded without the heap's sampler; true if it was recorded. */
static inline bool AHeapProfile_reportSample(uint32_t heap_id, uint64_t alloc_id,
                                             uint64_t size) {
  bool (*f)(uint32_t, uint64_t, uint64_t) = HEAPPROFD_API_FN_(report_sample);
  return f ? f(heap_id, alloc_id, size) : false;
}

/* The allocation `alloc_id` of `heap_id` was freed. */
static inline void AHeapProfile_reportFree(uint32_t heap_id, uint64_t alloc_id) {
  void (*f)(uint32_t, uint64_t) = HEAPPROFD_API_FN_(report_free);
  if (f) f(heap_id, alloc_id);
}

/* A new immutable context: `n` pairs keys[i] = values[i] extending
 * `parent` (0: the calling thread's current context). Its id; 0 without
 * the client. */
static inline uint64_t heapprofd_context_create(uint64_t parent, const char *const *keys,
                                                const char *const *values, size_t n) {
  uint64_t (*f)(uint64_t, const char *const *, const char *const *, size_t) =
      HEAPPROFD_API_FN_(context_create);
  return f ? f(parent, keys, values, n) : 0;
}

/* Installs context `id` on the calling thread; the token restores what was
 * installed before. */
static inline uint64_t heapprofd_context_activate(uint64_t id) {
  uint64_t (*f)(uint64_t) = HEAPPROFD_API_FN_(context_activate);
  return f ? f(id) : 0;
}

/* Puts back what `heapprofd_context_activate` replaced. */
static inline void heapprofd_context_deactivate(uint64_t token) {
  void (*f)(uint64_t) = HEAPPROFD_API_FN_(context_deactivate);
  if (f) f(token);
}

/* The calling thread's context (0: none). */
static inline uint64_t heapprofd_context_current(void) {
  uint64_t (*f)(void) = HEAPPROFD_API_FN_(context_current);
  return f ? f() : 0;
}

/* Context `id` will not be installed again (its id is never reused). */
static inline void heapprofd_context_release(uint64_t id) {
  void (*f)(uint64_t) = HEAPPROFD_API_FN_(context_release);
  if (f) f(id);
}

/* Names `tag` (not 0: CPU time) for the trace, e.g. "page-faults". Call it
 * outside signal handlers, before the first heapprofd_request_stack: it
 * also looks the client's functions up. 0 on success; negative for a bad
 * name (1 to 63 bytes, no comma), a tag already named otherwise, more than
 * 64 names, or without the client. */
static inline int heapprofd_register_event(uint64_t tag, const char *name) {
  int (*f)(uint64_t, const char *) = HEAPPROFD_API_FN_(register_event);
  return f ? f(tag, name) : -1;
}

/* Records the stack of the context a signal handler interrupted
 * (`ucontext`, the handler's third argument) as one sample of `tag`; NULL
 * records the caller's own stack, flagged biased. Async-signal-safe, errno
 * preserved. 0 recorded; negative not recorded: no profile is running (or
 * the functions were not looked up yet, see heapprofd_register_event), the
 * thread was inside the client, or the buffer was full (both counted as
 * lost samples of the thread). */
static inline int heapprofd_request_stack(const void *ucontext, uint64_t tag) {
  /* Never dlsym in a handler: only the table an earlier call loaded. */
  if (__atomic_load_n(&heapprofd_api_fns_.state, __ATOMIC_ACQUIRE) != 2) return -1;
  int (*f)(const void *, uint64_t) =
      __atomic_load_n(&heapprofd_api_fns_.request_stack, __ATOMIC_RELAXED);
  return f ? f(ucontext, tag) : -1;
}

#undef HEAPPROFD_API_LOAD_

/* ---- Stack-request API: the in-process walk -------------------------------
 *
 * int heapprofd_walk_prepare(void)
 *   Looks the client up (dlsym) and builds its unwind tables from the
 *   objects loaded now: every loaded object's .eh_frame_hdr/.eh_frame, read
 *   in place, and the JIT ranges of /tmp/perf-PID.map if it exists. Call it once, outside any signal handler, before walking
 *   (also from handlers). Afterwards every dlclose (before and after the
 *   object goes) and every dlopen update the tables by themselves,
 *   except a dlopen of a name without '/' whose search depends on its
 *   caller (the calling object has a DT_RUNPATH, or an object other than
 *   the program has a DT_RPATH): call it again after such a dlopen, or a
 *   pc in the new objects fails with NO_UNWIND_INFO; JIT code added to
 *   the perf map later also needs a call. Returns 0, or
 *   HEAPPROFD_WALK_UNAVAILABLE (-1) without the client.
 *
 * int heapprofd_walk_stack(const void *ucontext,
 *                          const struct heapprofd_stack_callbacks *cb,
 *                          void *user)
 *   Walks a stack now, on the calling thread, and reports it:
 *   begin(thread, biased, user), then frame(type, pc, user) from the
 *   innermost frame outwards, then exactly one of end(thread, user) (the
 *   outermost frame was reached) or failure(thread, reason, user) (the
 *   frames delivered before it are right; the rest is missing). `thread`
 *   is the kernel thread id. Any callback may be NULL.
 *   - ucontext: a signal handler's third argument (ucontext_t *): the walk
 *     starts at the interrupted instruction, unbiased (biased = 0; the
 *     first pc is the interrupted pc itself, the handler's frames are not
 *     part of it). NULL: the caller's own stack, biased = 1, the first pc
 *     being the return address into the function that called
 *     heapprofd_walk_stack (this header's wrapper is inlined at -O1 and
 *     above; at -O0 the wrapper is that function).
 *   - pc: the first frame of an unbiased walk is the interrupted pc; every
 *     other frame's pc is a return address (symbolize pc - 1), as gdb's
 *     `bt` shows them.
 *   - types: HEAPPROFD_FRAME_NATIVE, a pc in a loaded object (the
 *     program, a library, the vDSO), unwound by its .eh_frame;
 *     HEAPPROFD_FRAME_JIT, a pc in a range of the process's perf map
 *     (/tmp/perf-PID.map, as read by the last heapprofd_walk_prepare: call
 *     it again after the JIT adds code), unwound through its frame pointer
 *     (JITs keep them); HEAPPROFD_FRAME_UNKNOWN, a pc in neither (JIT code
 *     not in the map, or a corrupt return address), after which the walk
 *     fails with NO_UNWIND_INFO. HEAPPROFD_FRAME_INLINED is reserved: no
 *     walk delivers it (inlined frames are omitted: the walk reports
 *     physical frames).
 *   - reasons: HEAPPROFD_WALK_NO_UNWIND_INFO (a pc in no loaded object
 *     nor perf map range),
 *     HEAPPROFD_WALK_OUT_OF_BOUNDS (a frame's unwind rule needed memory
 *     outside the walked stack: a corrupt frame), HEAPPROFD_WALK_DEPTH_LIMIT
 *     (more than HEAPPROFD_WALK_MAX_FRAMES frames),
 *     HEAPPROFD_WALK_BAD_FRAME (the unwind went backwards, did not advance
 *     or overflowed), HEAPPROFD_WALK_TABLES_UPDATING (a dlopen or dlclose
 *     kept replacing the tables during the walk), HEAPPROFD_WALK_NO_STACK
 *     (the stack pointer is on no stack the client knows),
 *     HEAPPROFD_WALK_BUSY (HEAPPROFD_WALK_MAX_CONCURRENT walks already in
 *     progress in the process), HEAPPROFD_WALK_NOT_PREPARED (the client's
 *     tables were never built: its heapprofd_walk_prepare was not called).
 *   - returns HEAPPROFD_WALK_ENDED (0, end was called),
 *     HEAPPROFD_WALK_FAILED (1, failure was called),
 *     HEAPPROFD_WALK_UNAVAILABLE (-1: no client, or heapprofd_walk_prepare
 *     was never called in this translation unit; no callback runs: the
 *     no-op), HEAPPROFD_WALK_EINVAL (-2: cb is NULL).
 *   Async-signal-safe (once prepared): nothing is allocated or looked up,
 *   no lock is taken, errno is kept; memory is read only from the walked
 *   stack (from its stack pointer to its top) and from loaded objects, so
 *   a corrupt frame ends the walk with a failure, not a crash. The walk
 *   uses a few KiB of the calling stack (mind a small sigaltstack). A walk
 *   may interrupt a dlopen or dlclose that is updating the tables. Limits:
 *   a walk with NULL from inside a signal handler stops at the signal
 *   frame (pass the handler's ucontext instead); callbacks run inside the
 *   walk, in the handler if the walk is, and must not dlclose.
 */

#define HEAPPROFD_FRAME_UNKNOWN 0
#define HEAPPROFD_FRAME_NATIVE 1
#define HEAPPROFD_FRAME_JIT 2
#define HEAPPROFD_FRAME_INLINED 3 /* reserved */

#define HEAPPROFD_WALK_NO_UNWIND_INFO 1
#define HEAPPROFD_WALK_OUT_OF_BOUNDS 2
#define HEAPPROFD_WALK_DEPTH_LIMIT 3
#define HEAPPROFD_WALK_BAD_FRAME 4
#define HEAPPROFD_WALK_TABLES_UPDATING 5
#define HEAPPROFD_WALK_NO_STACK 6
#define HEAPPROFD_WALK_BUSY 7
#define HEAPPROFD_WALK_NOT_PREPARED 8

#define HEAPPROFD_WALK_ENDED 0
#define HEAPPROFD_WALK_FAILED 1
#define HEAPPROFD_WALK_UNAVAILABLE (-1)
#define HEAPPROFD_WALK_EINVAL (-2)

#define HEAPPROFD_WALK_MAX_FRAMES 256
#define HEAPPROFD_WALK_MAX_CONCURRENT 8

struct heapprofd_stack_callbacks {
  void (*begin)(uint64_t thread, int biased, void *user);
  void (*frame)(int type, uint64_t pc, void *user);
  void (*end)(uint64_t thread, void *user);
  void (*failure)(uint64_t thread, int reason, void *user);
};

/* The client's walk functions, looked up by heapprofd_walk_prepare only. */
static int (*heapprofd_walk_fn_)(const void *, const struct heapprofd_stack_callbacks *, void *);

static inline int heapprofd_walk_prepare(void) {
  int (*prepare)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "heapprofd_walk_prepare");
  int (*walk)(const void *, const struct heapprofd_stack_callbacks *, void *) =
      (int (*)(const void *, const struct heapprofd_stack_callbacks *, void *))dlsym(
          RTLD_DEFAULT, "heapprofd_walk_stack");
  if (!prepare || !walk) return HEAPPROFD_WALK_UNAVAILABLE;
  int rc = prepare();
  __atomic_store_n(&heapprofd_walk_fn_, walk, __ATOMIC_RELEASE);
  return rc;
}

static inline int heapprofd_walk_stack(const void *ucontext,
                                       const struct heapprofd_stack_callbacks *cb, void *user) {
  int (*f)(const void *, const struct heapprofd_stack_callbacks *, void *) =
      __atomic_load_n(&heapprofd_walk_fn_, __ATOMIC_ACQUIRE);
  return f ? f(ucontext, cb, user) : HEAPPROFD_WALK_UNAVAILABLE;
}

/* ---- end of the in-process walk ---------------------------------------- */

#ifdef __cplusplus
}
#endif

#endif /* HEAPPROFD_RS_HEAPPROFD_H */
