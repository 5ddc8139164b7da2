/* A dynamically linked program with no libc at all (an interpreter, no DT_NEEDED), like some
 * CNI plugins: the injector must not make it abort. Prints "nolibc ok" with a raw write. */
#if defined(__x86_64__)
static long sys3(long n, long a, long b, long c) {
    long ret;
    __asm__ volatile("syscall" : "=a"(ret) : "a"(n), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
    return ret;
}
#define SYS_write 1
#define SYS_exit 60
#endif

void _start(void) {
    static const char msg[] = "nolibc ok\n";
    sys3(SYS_write, 1, (long)msg, sizeof msg - 1);
    sys3(SYS_exit, 0, 0, 0);
    for (;;) {
    }
}
