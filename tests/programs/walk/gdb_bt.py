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
gdb.execute("break *heapprofd_rs_walk_stack")
gdb.execute("continue")
f = gdb.newest_frame()
while f is not None:
    if f.type() != gdb.INLINE_FRAME:
        print("GDB %x %s" % (f.pc(), f.name()))
    f = f.older()
gdb.execute("delete")
gdb.execute("continue")
