// A long-running Node.js target for `record --pid` tests: a timer that
// churns Buffers (backed by malloc through node's ArrayBuffer allocator),
// and the stdin commands of target.c: `work N` (prints "sum=<checksum>")
// and `quit`.
'use strict';
const readline = require('readline');

function jsWorkerAlloc(seed) {
  const bufs = [];
  for (let i = 0; i < 100; i++) bufs.push(Buffer.alloc(1000 + ((seed + i) % 50) * 100, i));
  return bufs.length;
}

function jsTargetWork(n) {
  let x = 2463534242;
  let sum = 0;
  let keep = [];
  for (let i = 0; i < n; i++) {
    x ^= x << 13; x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5; x >>>= 0;
    const b = Buffer.alloc(64 + (x % 2000), x & 0xff);
    sum = (sum * 31 + b.length + b[0]) % 1000000007;
    keep.push(b);
    if (keep.length > 300) keep = [];
  }
  return sum;
}

let seed = 0;
const timer = setInterval(() => jsWorkerAlloc(seed++), 1);
const rl = readline.createInterface({ input: process.stdin });
console.log('ready');
rl.on('line', (line) => {
  if (line.startsWith('work ')) {
    console.log('sum=' + jsTargetWork(parseInt(line.slice(5), 10)));
  } else if (line === 'quit') {
    clearInterval(timer);
    rl.close();
    console.log('bye');
  } else {
    console.log('unknown ' + line);
  }
});
