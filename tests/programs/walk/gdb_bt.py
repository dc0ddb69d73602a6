# gdb's frames at the entry of heapprofd_walk_stack (the client's
# exported entry), for tests/tests/stack_walk.rs: one "GDB pc name" line per
# physical frame (inlined frames share their caller's pc and are skipped:
# the walk reports physical frames), then the program runs on and prints
# its own walk of the same stack.
import gdb
gdb.execute("set pagination off")
gdb.execute("set backtrace past-main on")
gdb.execute("set backtrace past-entry on")
gdb.execute("break main")
gdb.execute("run")
gdb.execute("delete")
# At the entry of every copy of the client: with the client installed
# system-wide, the test's copy (in LD_PRELOAD, the one the program calls)
# and the installed one both define it, and `break *NAME` takes just one.
listing = gdb.execute("info functions ^heapprofd_rs_walk_stack$", to_string=True)
entries = sorted({int(w[0], 16) for w in (l.split() for l in listing.splitlines())
                  if len(w) == 2 and w[0].startswith("0x")
                  and w[1] == "heapprofd_rs_walk_stack"})
for entry in entries:
    gdb.execute("break *0x%x" % entry)
if not entries:
    gdb.execute("break *heapprofd_rs_walk_stack")
gdb.execute("continue")
f = gdb.newest_frame()
while f is not None:
    if f.type() != gdb.INLINE_FRAME:
        print("GDB %x %s" % (f.pc(), f.name()))
    f = f.older()
gdb.execute("delete")
gdb.execute("continue")
