/* System calls through the i386 table (int 0x80), which an x86_64 filter
 * that forgot the arch check would not see: `bypass_int80 socket|socketcall|getpid`
 * prints {"ok": ..., "errno": ..., "detail": ...} like bypass_probe.py. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static long int80(long nr, long a, long b, long c) {
    long ret;
    __asm__ volatile ("int $0x80" : "=a"(ret) : "a"(nr), "b"(a), "c"(b), "d"(c) : "memory");
    return ret;
}

static const char *name(long err) {
    switch (err) {
    case ENOSYS: return "ENOSYS";
    case EPERM: return "EPERM";
    case EAFNOSUPPORT: return "EAFNOSUPPORT";
    case EFAULT: return "EFAULT";
    case EINVAL: return "EINVAL";
    default: return "EOTHER";
    }
}

int main(int argc, char **argv) {
    /* socketcall reads its arguments as 32-bit words at a 32-bit address. */
    unsigned int *args = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS | MAP_32BIT, -1, 0);
    long ret;
    if (args == MAP_FAILED)
        return 2;
    args[0] = 2; args[1] = 1; args[2] = 0;      /* AF_INET, SOCK_STREAM, 0 */
    const char *what = argc > 1 ? argv[1] : "socket";
    if (strcmp(what, "socket") == 0)
        ret = int80(359, 2, 1, 0);             /* i386 socket(AF_INET, SOCK_STREAM, 0) */
    else if (strcmp(what, "socketcall") == 0)
        ret = int80(102, 1, (long)(unsigned long)args, 0);  /* socketcall(SYS_SOCKET, args) */
    else
        ret = int80(20, 0, 0, 0);              /* i386 getpid */
    if (ret >= 0) {
        printf("{\"ok\": true, \"errno\": null, \"detail\": \"int 0x80 %s returned %ld\"}\n", what, ret);
        if (strcmp(what, "getpid") != 0)
            close((int)ret);
    } else {
        printf("{\"ok\": false, \"errno\": \"%s\", \"detail\": \"int 0x80 %s: %ld\"}\n", name(-ret), what, ret);
    }
    return 0;
}
