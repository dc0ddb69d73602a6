/* A 32-bit x86 program without libc (assembled with `as --32`, linked with
 * `ld -m elf_i386`): writes "ready\n" and then pauses forever, so an
 * x86_64 heapprofd-rs can be pointed at a process of another architecture. */
  .globl _start
  .text
_start:
  movl $4, %eax        /* write(1, msg, 6) */
  movl $1, %ebx
  movl $msg, %ecx
  movl $6, %edx
  int $0x80
1:
  movl $29, %eax       /* pause() */
  int $0x80
  jmp 1b
  .data
msg:
  .ascii "ready\n"
