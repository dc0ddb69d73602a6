# gdb batch script: stop at $HP_BREAK, dump what a heapprofd sample holds
# (registers, stack bytes from $sp to the end of its mapping, the vdso, the
# maps) and gdb's own backtrace, into $HP_OUT. Run as
#   gdb -batch -nx -q -x capture.py --args PROGRAM ARGS...
import os
import gdb

out = os.environ["HP_OUT"]
gdb.execute("set pagination off")
gdb.execute("set confirm off")
gdb.execute("set backtrace past-main on")
gdb.execute("set backtrace past-entry on")
gdb.execute("set backtrace limit 0")
gdb.execute("break " + os.environ["HP_BREAK"])
gdb.execute("run")

inf = gdb.selected_inferior()
pid = inf.pid
frame = gdb.newest_frame()
names = ["rax", "rdx", "rcx", "rbx", "rsi", "rdi", "rbp", "rsp",
         "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15", "rip"]
with open(os.path.join(out, "regs"), "w") as f:
    for i, n in enumerate(names):
        v = int(frame.read_register(n)) & 0xFFFFFFFFFFFFFFFF
        f.write("%d %s %#x\n" % (i, n, v))

with open("/proc/%d/maps" % pid) as f:
    maps = f.read()
with open(os.path.join(out, "maps"), "w") as f:
    f.write(maps)

sp = int(frame.read_register("rsp")) & 0xFFFFFFFFFFFFFFFF

def dump(name, start, end):
    data = inf.read_memory(start, end - start)
    with open(os.path.join(out, name), "wb") as f:
        f.write(bytes(data))
    with open(os.path.join(out, name + ".addr"), "w") as f:
        f.write("%#x\n" % start)

for line in maps.splitlines():
    parts = line.split()
    lo, hi = (int(x, 16) for x in parts[0].split("-"))
    if lo <= sp < hi:
        dump("stack", sp, hi)
    if len(parts) >= 6 and parts[5] == "[vdso]":
        dump("vdso", lo, hi)

# gdb's backtrace. Tail-call frames are synthesized by gdb from DWARF
# call-site information (a function that jumped to its callee has no frame
# on the stack); a stack unwinder cannot see them, so they are written to
# bt.all only.
with open(os.path.join(out, "bt"), "w") as f, open(os.path.join(out, "bt.all"), "w") as a:
    fr = gdb.newest_frame()
    while fr is not None:
        name = fr.name() or "??"
        a.write("%s\t%d\t%#x\n" % (name, fr.type(), fr.pc()))
        if fr.type() != gdb.TAILCALL_FRAME:
            f.write(name + "\n")
        fr = fr.older()
with open(os.path.join(out, "bt.txt"), "w") as f:
    f.write(gdb.execute("bt", to_string=True))
with open(os.path.join(out, "pid"), "w") as f:
    f.write("%d\n" % pid)
gdb.execute("kill")
