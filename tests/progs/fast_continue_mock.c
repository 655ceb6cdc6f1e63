/* stages/helper/supervisor/fast_continue.c's decide() behind a mock of its system calls
   (tests/test_supervisor_differential.py).

   Each line on stdin is one case: a notification and the world it meets (the
   thread, its socket, the address in its memory, the file a path names, the
   table of recorded socket files), as key=value words. For each, one line on
   stdout: what decide() answered (TO_PYTHON, GO_ON, GONE, CONNECTED with the
   address it connected to, or TARGET when it connected through the fd of the
   file the path names), then any VIOLATION the mock saw (an fd closed that
   was never opened, a connect made for an answer that is not CONNECTED, a
   lookup under /proc).

   The test compiles fast_continue.c into this file (#include, with
   FAST_CONTINUE_MOCK: no Python module), the system calls it makes named
   mock_* by the -D flags the test gives. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

struct file_handle;

int mock_openat(int dirfd, const char *path, int flags, ...);
int mock_fstat(int fd, struct stat *st);
long mock_syscall(long nr, ...);
ssize_t mock_process_vm_readv(pid_t pid, const struct iovec *local, unsigned long lcnt,
                              const struct iovec *remote, unsigned long rcnt, unsigned long flags);
int mock_getsockopt(int fd, int level, int name, void *value, socklen_t *size);
int mock_fcntl(int fd, int cmd, ...);
int mock_ioctl(int fd, unsigned long request, ...);
int mock_name_to_handle_at(int dirfd, const char *path, struct file_handle *fh, int *mount_id,
                           int flags);
int mock_close(int fd);

#include "fast_continue.c"

/* ---------------------------------------------------------------- the world */
enum kind { FREE, TASK, ROOT, PIDFD, SOCK, TARGET };

static struct {
    long pid;                   /* the thread that exists (its TID) */
    int thread;                 /* it exists */
    int threads;                /* its group's threads */
    int fd;                     /* the fd number its socket has (-1: none) */
    int domain;                 /* 0: the fd is no socket */
    uint64_t cookie;
    int nonblocking;
    int id_valid;
    unsigned char memory[256];
    int memory_len;             /* -1: the address is not mapped */
    int target_errno;           /* what openat2 says (0: the file below) */
    int target_sock;
    uint64_t dev, ino;
    int handle_errno;           /* what name_to_handle_at says (0: the handle below) */
    int handle_type;
    unsigned char handle[64];
    int handle_len;
} w;

static enum kind fds[4096];
static char said[4096];         /* the violations of this case */
static char connected[512];     /* the connect made, as the answer line shows it */
static int connects;

static void violation(const char *what, long value)
{
    size_t used = strlen(said);
    snprintf(said + used, sizeof said - used, " VIOLATION %s %ld", what, value);
}

static int new_fd(enum kind kind)
{
    for (int fd = 100; fd < 4096; fd++)
        if (fds[fd] == FREE) {
            fds[fd] = kind;
            return fd;
        }
    violation("out-of-fds", 0);
    errno = EMFILE;
    return -1;
}

static int is(int fd, enum kind kind)
{
    return fd >= 0 && fd < 4096 && fds[fd] == kind;
}

int mock_close(int fd)
{
    if (fd < 0 || fd >= 4096 || fds[fd] == FREE) {
        violation("close-of-an-fd-never-opened", fd);
        errno = EBADF;
        return -1;
    }
    fds[fd] = FREE;
    return 0;
}

int mock_openat(int dirfd, const char *path, int flags, ...)
{
    (void)dirfd;
    (void)flags;
    char task[64], root[64];
    snprintf(task, sizeof task, "%ld/task", w.pid);
    snprintf(root, sizeof root, "%ld/root", w.pid);
    if (w.thread && strcmp(path, task) == 0)
        return new_fd(TASK);
    if (w.thread && strcmp(path, root) == 0)
        return new_fd(ROOT);
    errno = ENOENT;
    return -1;
}

int mock_fstat(int fd, struct stat *st)
{
    memset(st, 0, sizeof *st);
    if (is(fd, TASK)) {
        st->st_mode = S_IFDIR | 0555;
        st->st_nlink = (nlink_t)(2 + (w.thread ? w.threads : 0));
        return 0;
    }
    if (is(fd, TARGET)) {
        st->st_mode = w.target_sock ? S_IFSOCK | 0777 : S_IFREG | 0644;
        st->st_dev = (dev_t)w.dev;
        st->st_ino = (ino_t)w.ino;
        return 0;
    }
    errno = EBADF;
    return -1;
}

/* The path as the lookup meets it: past "/", "." and ".." at the root. */
static const char *past_the_root(const char *path)
{
    for (;;) {
        if (*path == '/')
            path++;
        else if (path[0] == '.' && (path[1] == '/' || path[1] == 0))
            path++;
        else if (path[0] == '.' && path[1] == '.' && (path[2] == '/' || path[2] == 0))
            path += 2;
        else
            return path;
    }
}

long mock_syscall(long nr, ...)
{
    va_list ap;
    va_start(ap, nr);
    long a = va_arg(ap, long), b = va_arg(ap, long);
    va_end(ap);
    if (nr == SYS_pidfd_open) {
        if (w.thread && a == w.pid && a > 0)
            return new_fd(PIDFD);
        errno = ESRCH;
        return -1;
    }
    if (nr == SYS_pidfd_getfd) {
        if (is((int)a, PIDFD) && w.thread && w.fd >= 0 && b == w.fd)
            return new_fd(SOCK);
        errno = EBADF;
        return -1;
    }
    if (nr == SYS_openat2) {
        const char *path = (const char *)b;
        const char *first = past_the_root(path);
        if (strncmp(first, "proc", 4) == 0 && (first[4] == '/' || first[4] == 0))
            violation("a-lookup-under-proc", 0);
        if (!is((int)a, ROOT)) {
            errno = EBADF;
            return -1;
        }
        if (w.target_errno) {
            errno = w.target_errno;
            return -1;
        }
        return new_fd(TARGET);
    }
    violation("syscall", nr);
    errno = ENOSYS;
    return -1;
}

ssize_t mock_process_vm_readv(pid_t pid, const struct iovec *local, unsigned long lcnt,
                              const struct iovec *remote, unsigned long rcnt, unsigned long flags)
{
    (void)lcnt;
    (void)rcnt;
    (void)flags;
    (void)remote;
    if (!w.thread || pid != w.pid) {
        errno = ESRCH;
        return -1;
    }
    if (w.memory_len < 0 || local->iov_len > (size_t)w.memory_len) {
        errno = EFAULT;
        return -1;
    }
    memcpy(local->iov_base, w.memory, local->iov_len);
    return (ssize_t)local->iov_len;
}

int mock_getsockopt(int fd, int level, int name, void *value, socklen_t *size)
{
    if (!is(fd, SOCK) || level != SOL_SOCKET) {
        errno = is(fd, SOCK) ? ENOPROTOOPT : EBADF;
        return -1;
    }
    if (!w.domain) {
        errno = ENOTSOCK;
        return -1;
    }
    if (name == SO_DOMAIN && *size >= sizeof(int)) {
        *(int *)value = w.domain;
        *size = sizeof(int);
        return 0;
    }
    if (name == SO_NETNS_COOKIE && *size >= sizeof(uint64_t)) {
        memcpy(value, &w.cookie, sizeof w.cookie);
        *size = sizeof(uint64_t);
        return 0;
    }
    errno = ENOPROTOOPT;
    return -1;
}

int mock_fcntl(int fd, int cmd, ...)
{
    if (!is(fd, SOCK) || cmd != F_GETFL) {
        errno = EBADF;
        return -1;
    }
    return O_RDWR | (w.nonblocking ? O_NONBLOCK : 0);
}

int mock_ioctl(int fd, unsigned long request, ...)
{
    (void)fd;
    if (request == SECCOMP_IOCTL_NOTIF_ID_VALID) {
        if (w.id_valid)
            return 0;
        errno = ENOENT;
        return -1;
    }
    violation("ioctl", (long)request);
    errno = EINVAL;
    return -1;
}

int mock_connect(int fd, __CONST_SOCKADDR_ARG address, socklen_t size)
{
    connects++;
    if (!is(fd, SOCK))
        violation("connect-on-no-socket-taken", fd);
    const unsigned char *raw = (const unsigned char *)address.__sockaddr__;
    const char *via = "self/fd/";
    if (size > 2 && raw[0] == AF_UNIX && raw[1] == 0 &&
        strncmp((const char *)raw + 2, via, strlen(via)) == 0) {
        int target = atoi((const char *)raw + 2 + strlen(via));
        if (!is(target, TARGET))
            violation("connect-through-an-fd-not-the-target", target);
        snprintf(connected, sizeof connected, "TARGET");
        return 0;
    }
    int used = snprintf(connected, sizeof connected, "CONNECTED ");
    for (socklen_t i = 0; i < size && used < (int)sizeof connected - 3; i++)
        used += snprintf(connected + used, sizeof connected - (size_t)used, "%02x", raw[i]);
    return 0;
}

int mock_name_to_handle_at(int dirfd, const char *path, struct file_handle *fh, int *mount_id,
                           int flags)
{
    (void)path;
    (void)flags;
    *mount_id = 1;
    if (!is(dirfd, TARGET)) {
        errno = EBADF;
        return -1;
    }
    if (w.handle_errno) {
        errno = w.handle_errno;
        return -1;
    }
    if (fh->handle_bytes < (unsigned)w.handle_len) {
        fh->handle_bytes = (unsigned)w.handle_len;
        errno = EOVERFLOW;
        return -1;
    }
    fh->handle_bytes = (unsigned)w.handle_len;
    fh->handle_type = w.handle_type;
    memcpy(fh->f_handle, w.handle, (size_t)w.handle_len);
    return 0;
}

/* ---------------------------------------------------------------- the cases */
static int unhex(const char *hex, unsigned char *out, int room)
{
    int n = 0;
    while (hex[0] && hex[1] && n < room) {
        unsigned value;
        if (sscanf(hex, "%2x", &value) != 1)
            break;
        out[n++] = (unsigned char)value;
        hex += 2;
    }
    return n;
}

static unsigned char listened[PORT_BITS_BYTES];
static unsigned char table[TABLE_HEAD + 64 * sizeof(struct slot)];

int main(void)
{
    char line[8192];
    while (fgets(line, sizeof line, stdin)) {
        struct seccomp_notif n;
        memset(&n, 0, sizeof n);
        memset(&w, 0, sizeof w);
        memset(listened, 0, sizeof listened);
        memset(table, 0, sizeof table);
        memset(fds, 0, sizeof fds);
        /* Each case meets the receiving thread as it starts: its kept slots
           zero-filled (tid, pidfd and task 0), as a new thread's are. */
        memset(kept, 0, sizeof kept);
        next_out = 0;
        said[0] = connected[0] = 0;
        connects = 0;
        w.fd = -1;
        uint64_t sandbox = 0;
        uint32_t used = 0;
        struct slot *slots = (struct slot *)(table + TABLE_HEAD);
        for (char *word = strtok(line, " \n"); word; word = strtok(NULL, " \n")) {
            char *value = strchr(word, '=');
            if (!value)
                continue;
            *value++ = 0;
            if (!strcmp(word, "nr")) n.data.nr = atoi(value);
            else if (!strcmp(word, "arch")) n.data.arch = (uint32_t)strtoul(value, NULL, 0);
            else if (!strcmp(word, "pid")) n.pid = (uint32_t)strtoul(value, NULL, 0);
            else if (!strcmp(word, "tid")) w.pid = strtol(value, NULL, 0);
            else if (!strcmp(word, "arg0")) n.data.args[0] = strtoull(value, NULL, 0);
            else if (!strcmp(word, "arg2")) n.data.args[2] = strtoull(value, NULL, 0);
            else if (!strcmp(word, "thread")) w.thread = atoi(value);
            else if (!strcmp(word, "threads")) w.threads = atoi(value);
            else if (!strcmp(word, "fd")) w.fd = atoi(value);
            else if (!strcmp(word, "domain")) w.domain = atoi(value);
            else if (!strcmp(word, "cookie")) w.cookie = strtoull(value, NULL, 0);
            else if (!strcmp(word, "sandbox")) sandbox = strtoull(value, NULL, 0);
            else if (!strcmp(word, "nb")) w.nonblocking = atoi(value);
            else if (!strcmp(word, "valid")) w.id_valid = atoi(value);
            else if (!strcmp(word, "memory"))
                w.memory_len = strcmp(value, "unmapped") ? unhex(value, w.memory, sizeof w.memory) : -1;
            else if (!strcmp(word, "target_errno")) w.target_errno = atoi(value);
            else if (!strcmp(word, "target_sock")) w.target_sock = atoi(value);
            else if (!strcmp(word, "dev")) w.dev = strtoull(value, NULL, 0);
            else if (!strcmp(word, "ino")) w.ino = strtoull(value, NULL, 0);
            else if (!strcmp(word, "handle_errno")) w.handle_errno = atoi(value);
            else if (!strcmp(word, "handle_type")) w.handle_type = atoi(value);
            else if (!strcmp(word, "handle")) w.handle_len = unhex(value, w.handle, sizeof w.handle);
            else if (!strcmp(word, "listened")) {
                for (char *p = value; *p; ) {
                    long port = strtol(p, &p, 10);
                    if (port >= 0 && port < 65536)
                        listened[port >> 3] |= (unsigned char)(1 << (port & 7));
                    if (*p == ',')
                        p++;
                    else
                        break;
                }
            } else if (!strcmp(word, "slot") && used < 64) {
                /* kind:dev:handle_type:hex, or busy:... (odd sequence: being rewritten) */
                struct slot *s = &slots[used++];
                int busy = strncmp(value, "busy:", 5) == 0;
                char hex[200] = "";
                unsigned kind = 0;
                unsigned long long dev = 0;
                int type = 0;
                sscanf(value + (busy ? 5 : 0), "%u:%llu:%d:%199s", &kind, &dev, &type, hex);
                s->seq = busy ? 3 : 2;
                s->kind = kind;
                s->dev = dev;
                s->handle_type = type;
                s->handle_bytes = (uint32_t)unhex(hex, s->handle, HANDLE_MAX);
            }
        }
        memcpy(table, &used, sizeof used);
        struct names names = {listened, table, (ptrdiff_t)sizeof table, sandbox};
        int sock = -1, target = -1, result = 0;
        enum answer answer = decide(3, 4, &n, &names, &sock, &target, &result);
        if (sock >= 0)
            mock_close(sock);
        if (target >= 0)
            mock_close(target);
        const char *shown = answer == TO_PYTHON ? "TO_PYTHON" : answer == GO_ON ? "GO_ON"
                          : answer == GONE ? "GONE" : connected[0] ? connected : "CONNECTED?";
        if (answer != CONNECTED && connects)
            violation("a-connect-made-for-an-answer-not-connected", answer);
        /* What the slots keep open past the case is the module's: closed here. */
        for (int i = 0; i < KEPT; i++)
            if (kept[i].tid > 0) {
                if (kept[i].pidfd >= 0)
                    mock_close(kept[i].pidfd);
                if (kept[i].task >= 0)
                    mock_close(kept[i].task);
            }
        printf("%s%s\n", shown, said);
        fflush(stdout);
    }
    return 0;
}
