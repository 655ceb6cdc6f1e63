/* socket(AF_UNIX, SOCK_STREAM, 0) through the i386 system call table (int 0x80,
 * i386 nr 359), which a filter written for x86_64 numbers would not see. */
#include <stdio.h>
int main(void) {
    long ret;
    __asm__ volatile ("int $0x80" : "=a"(ret) : "a"(359L), "b"(1L), "c"(1L), "d"(0L) : "memory");
    if (ret >= 0) printf("RESULT OK\n");
    else if (ret == -38) printf("RESULT ENOSYS\n");
    else if (ret == -1) printf("RESULT EPERM\n");
    else if (ret == -97) printf("RESULT EAFNOSUPPORT\n");
    else printf("RESULT E%ld\n", -ret);
    return 0;
}
