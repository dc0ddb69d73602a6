# A long-running Python target for `record --pid` tests: a worker thread
# building lists of dicts and strings (py_worker_alloc), and the stdin
# commands of target.c: `work N` (prints "sum=<checksum>") and `quit`.
import sys
import threading
import time

stop = False


def py_worker_alloc(seed):
    recs = [{"k": i, "v": "p" * ((seed + i) % 300)} for i in range(500)]
    return len(recs)


def worker():
    seed = 0
    while not stop:
        py_worker_alloc(seed)
        seed += 1
        time.sleep(0.0005)


def py_target_work(n):
    x = 88172645463325252
    total = 0
    keep = []
    for _ in range(n):
        x ^= (x << 13) & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 7
        x ^= (x << 17) & 0xFFFFFFFFFFFFFFFF
        s = "w" * (8 + x % 200)
        keep.append(s)
        total = (total * 31 + len(s)) % (1 << 61)
        if len(keep) > 300:
            keep = []
    return total


t = threading.Thread(target=worker)
t.start()
print("ready", flush=True)
for line in sys.stdin:
    line = line.strip()
    if line.startswith("work "):
        print("sum=%d" % py_target_work(int(line[5:])), flush=True)
    elif line == "quit":
        break
    else:
        print("unknown " + line, flush=True)
stop = True
t.join()
print("bye", flush=True)
