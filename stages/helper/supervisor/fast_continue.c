/* The supervisor's compiled fast path: the connects it can answer without Python.

   stages/helper/supervisor/shell.py answers every connect() of the program.
   Most are TCP connects: of a program of one thread (ab, curl, a Python
   client), which it lets the kernel go on with (SECCOMP_USER_NOTIF_FLAG_
   CONTINUE), or of a program of many (Node, Go, tokio, Chromium), whose
   connect it makes itself on the socket it took. Made in Python, either
   answer costs tens of microseconds of interpreter per connect, and the
   program's thread waits for all of them.

   receive() waits for notifications with the GIL let go, and answers here,
   in C, those the Python code would answer the same way, by the same tests
   (stages/helper/supervisor/judge.py decide(), the argument in
   docs/security.md "Unix sockets by origin"):
     0. the call is connect() of x86_64, from a thread with a TID above 0
        (anything else, listen() among them, is the Python code's);
     1. the thread group is counted (the link count of a kept
        /proc/TID/task, less two) before the socket is taken;
     2. the socket taken with pidfd_getfd (a kept PIDFD_THREAD pidfd);
     3. the address, read once (process_vm_readv), 2 to 128 bytes, whose
        family is not AF_UNIX;
     4. the socket's SO_DOMAIN is AF_INET or AF_INET6, and its
        SO_NETNS_COOKIE the sandbox's (not a socket made outside);
     5. the address is not loopback at a port no listener has been seen on
        (the Python code's bitmap of such ports, 65536 bits, only ever set);
     6. a thread alone in its group: "continue". Another: when the socket is
        non-blocking (a connect that cannot wait), NOTIF_ID_VALID, then the
        connect made here on the socket taken, to the bytes read, and its
        result is the answer (decide() below).
   A non-blocking Unix socket's connect to an absolute path (not under
   /proc) whose socket file's handle is one the Python code recorded as
   bound inside (at the listen() of a socket made in the sandbox) is made
   here too, through the descriptor checked (unix_inside() below); every
   other Unix connect, and every refusal, is the Python code's.
   Anything else (and any error on the way) returns the notification to the
   Python code untouched, which decides it from the start as it does where
   this module did not build: this path never decides anything else, so it
   only ever answers what the Python code would answer, and as it would.

   Kept fds by TID are sound for the reasons Threads in program_threads.py
   gives: each names one thread for life; a thread that is gone makes
   pidfd_getfd fail and its task directory count no thread. They are this
   OS thread's own (each receiving thread has its own table), never shared. */
#ifndef FAST_CONTINUE_MOCK
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#endif

#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <linux/audit.h>
#include <linux/seccomp.h>
#include <netinet/tcp.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <stddef.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif
#ifndef PIDFD_THREAD
#define PIDFD_THREAD O_EXCL
#endif
#ifndef SYS_openat2
#define SYS_openat2 437
#endif
#ifndef SO_DOMAIN
#define SO_DOMAIN 39
#endif
#ifndef SO_NETNS_COOKIE
#define SO_NETNS_COOKIE 71
#endif
#ifndef AT_HANDLE_FID
#define AT_HANDLE_FID 0x200
#endif
#define SOCKADDR_MAX 128        /* sizeof(struct sockaddr_storage): the kernel's limit */
#define KEPT 8                  /* as KEPT_PER_RECEIVER */
#define PORT_BITS_BYTES (65536 / 8)

struct kept {
    pid_t tid;                  /* 0: a free slot */
    int pidfd;
    int task;                   /* O_PATH of /proc/TID/task */
};

static __thread struct kept kept[KEPT];
static __thread unsigned next_out;      /* the slot given up next when all are used */

static void drop(struct kept *k)
{
    if (k->tid > 0 && k->pidfd >= 0)
        close(k->pidfd);
    if (k->tid > 0 && k->task >= 0)
        close(k->task);
    k->tid = 0;
    k->pidfd = k->task = -1;
}

/* A free slot has tid 0 (and, zero-filled as a new thread's, pidfd and
   task 0: never closed, since drop() closes only a slot in use); no
   notification with a TID of 0 or less reaches here (decide()), and no
   TID ever matches a free slot. */
static struct kept *slot_of(pid_t tid)
{
    if (tid <= 0)
        return NULL;
    for (int i = 0; i < KEPT; i++)
        if (kept[i].tid == tid)
            return &kept[i];
    return NULL;
}

static struct kept *new_slot(pid_t tid)
{
    struct kept *k = NULL;
    for (int i = 0; i < KEPT && !k; i++)
        if (kept[i].tid == 0)
            k = &kept[i];
    if (!k) {
        k = &kept[next_out++ % KEPT];
        drop(k);
    }
    k->tid = tid;
    k->pidfd = k->task = -1;
    return k;
}

/* 1 when the thread is alone in its group, 0 when not or when that cannot
   be told. Opens (and keeps) the task directory when it has none, or when
   the kept one's thread is gone. */
static int alone(int proc, struct kept *k)
{
    for (int tries = 0; tries < 2; tries++) {
        if (k->task < 0) {
            char path[32];
            snprintf(path, sizeof path, "%d/task", (int)k->tid);
            k->task = openat(proc, path, O_PATH | O_DIRECTORY | O_CLOEXEC);
            if (k->task < 0)
                return 0;
        }
        struct stat st;
        if (fstat(k->task, &st) < 0)
            return 0;
        long count = (long)st.st_nlink - 2;
        if (count > 0)
            return count == 1;
        close(k->task);         /* its thread is gone: opened again, by TID */
        k->task = -1;
    }
    return 0;
}

/* The thread's fd, duplicated here; -1 when it cannot be taken. */
static int take(struct kept *k, int fd)
{
    if (k->pidfd >= 0) {
        int sock = (int)syscall(SYS_pidfd_getfd, k->pidfd, fd, 0);
        if (sock >= 0)
            return sock;
        close(k->pidfd);
        k->pidfd = -1;
    }
    k->pidfd = (int)syscall(SYS_pidfd_open, k->tid, PIDFD_THREAD);
    if (k->pidfd < 0)
        return -1;              /* a kernel before 6.9 among them: Python's path */
    return (int)syscall(SYS_pidfd_getfd, k->pidfd, fd, 0);
}

/* The port when the address is 127.0.0.1, ::1 or ::ffff:127.0.0.1; -1 else
   (loopback_port in judge.py). */
static int loopback_port(const unsigned char *raw, int len)
{
    static const unsigned char v4[4] = {127, 0, 0, 1};
    static const unsigned char v6[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    static const unsigned char mapped[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff,
                                             127, 0, 0, 1};
    int family = raw[0] | raw[1] << 8;
    /* The port's bytes (2 and 3) only once the length says they were read. */
    if (family == AF_INET && len >= 8 && memcmp(raw + 4, v4, 4) == 0)
        return raw[2] << 8 | raw[3];
    if (family == AF_INET6 && len >= 24 &&
        (memcmp(raw + 8, v6, 16) == 0 || memcmp(raw + 8, mapped, 16) == 0))
        return raw[2] << 8 | raw[3];
    return -1;
}

/* What decide() found for one notification. */
enum answer {
    TO_PYTHON,          /* returned unanswered: the Python code decides it */
    GO_ON,              /* "continue": the kernel runs the program's own call */
    CONNECTED,          /* made here: the result is the program's */
    GONE,               /* the thread no longer waits: nobody to answer */
};

/* The address, read once from the thread's memory into `raw` (2 to 128 bytes). */
static int read_once(const struct seccomp_notif *n, unsigned char *raw, int length)
{
    if (length < 2 || length > SOCKADDR_MAX)
        return 0;
    struct iovec local = {raw, (size_t)length};
    struct iovec remote = {(void *)(uintptr_t)n->data.args[1], (size_t)length};
    return process_vm_readv((pid_t)n->pid, &local, 1, &remote, 1, 0) == length;
}

static int domain_of(int sock)
{
    int domain = -1;
    socklen_t size = sizeof domain;
    return getsockopt(sock, SOL_SOCKET, SO_DOMAIN, &domain, &size) == 0 ? domain : -1;
}

/* The socket's open file is O_NONBLOCK: its connect cannot wait. */
static int nonblocking(int sock)
{
    int flags = fcntl(sock, F_GETFL);
    return flags >= 0 && (flags & O_NONBLOCK);
}

/* The connect made here, on the socket taken, once NOTIF_ID_VALID says the
   thread waited all along (its TID named it throughout: the socket, the
   bytes and its root are its own). */
static enum answer connect_here(int listener, const struct seccomp_notif *n, int sock,
                                const void *address, int length, int *result)
{
    __u64 id = n->id;
    if (ioctl(listener, SECCOMP_IOCTL_NOTIF_ID_VALID, &id) < 0)
        return GONE;
    *result = connect(sock, (const struct sockaddr *)address, (socklen_t)length) == 0 ? 0 : errno;
    return CONNECTED;
}

/* The network namespace the socket was made in, by its cookie; 0 when it
   cannot be told (no cookie is 0). */
static uint64_t cookie_of(int sock)
{
    uint64_t cookie = 0;
    socklen_t size = sizeof cookie;
    return getsockopt(sock, SOL_SOCKET, SO_NETNS_COOKIE, &cookie, &size) == 0 ? cookie : 0;
}

/* What receive() was given to decide by: the loopback ports seen with a
   listener, the table of recorded socket files (BoundTable in
   bound.py) and the sandbox's network namespace cookie. */
struct names {
    const unsigned char *listened;
    const unsigned char *table;
    ptrdiff_t table_len;
    uint64_t cookie;
};

/* An IP socket made in the sandbox and an IP address the kernel may be let
   connect: not a loopback port no listener has been seen on (that connect
   is the Python code's, whose refusal is evidence for a hint). A socket
   made outside (passed in over SCM_RIGHTS) would connect from the network
   namespace it was made in: the Python code's, which refuses it. */
static int inet_may_go(int sock, const unsigned char *raw, int length,
                       const struct names *names)
{
    int domain = domain_of(sock);
    if (domain != AF_INET && domain != AF_INET6)
        return 0;
    if (cookie_of(sock) != names->cookie)
        return 0;
    int port = loopback_port(raw, length);
    return port < 0 || (names->listened[port >> 3] >> (port & 7) & 1);
}

/* One slot of the table (BoundTable in bound.py): a sequence
   number, odd while the Python code rewrites the slot, then the identity. */
#define HANDLE_MAX 64
#define SLOT_BOUND 1
struct slot {
    uint32_t seq;
    uint32_t kind;              /* 0 free, 1 bound inside, 2 named by the policy */
    uint64_t dev;
    int32_t handle_type;
    uint32_t handle_bytes;
    unsigned char handle[HANDLE_MAX];
} __attribute__((packed));
#define TABLE_HEAD 8

/* The kind of the slot whose identity is (dev, the handle), read whole
   (the same even sequence number before and after); 0 when none is. */
static uint32_t recorded(const struct names *names, uint64_t dev, const struct file_handle *fh)
{
    if (names->table_len < TABLE_HEAD)
        return 0;
    uint32_t used = __atomic_load_n((const uint32_t *)names->table, __ATOMIC_ACQUIRE);
    ptrdiff_t room = (names->table_len - TABLE_HEAD) / (ptrdiff_t)sizeof(struct slot);
    if ((ptrdiff_t)used > room)
        used = (uint32_t)room;
    const struct slot *slots = (const struct slot *)(names->table + TABLE_HEAD);
    for (uint32_t i = 0; i < used; i++) {
        uint32_t before = __atomic_load_n(&slots[i].seq, __ATOMIC_ACQUIRE);
        if (before & 1)
            continue;
        struct slot copy;
        memcpy(&copy, &slots[i], sizeof copy);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(&slots[i].seq, __ATOMIC_RELAXED) != before)
            continue;           /* rewritten meanwhile: as if not there */
        if (copy.kind && copy.dev == dev && copy.handle_type == fh->handle_type &&
            copy.handle_bytes == fh->handle_bytes && fh->handle_bytes <= HANDLE_MAX &&
            memcmp(copy.handle, fh->f_handle, fh->handle_bytes) == 0)
            return copy.kind;
    }
    return 0;
}

/* The file handle of `fd` (name_to_handle_at, as seccomp_notify.file_handle:
   AT_HANDLE_FID first); 0 when it has one. */
static int handle_of(int fd, struct file_handle *fh)
{
    int mount_id;
    fh->handle_bytes = HANDLE_MAX;
    if (name_to_handle_at(fd, "", fh, &mount_id, AT_EMPTY_PATH | AT_HANDLE_FID) == 0)
        return 0;
    if (errno != EINVAL)
        return -1;
    fh->handle_bytes = HANDLE_MAX;
    return name_to_handle_at(fd, "", fh, &mount_id, AT_EMPTY_PATH);
}

/* An O_PATH fd of the absolute `path` as the program's thread finds it
   (RESOLVE_IN_ROOT under /proc/TID/root, which refuses /proc's magic links);
   -1 on any error. */
static int open_in_root(int proc, pid_t tid, const char *path)
{
    char name[32];
    snprintf(name, sizeof name, "%d/root", (int)tid);
    int root = openat(proc, name, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (root < 0)
        return -1;
    struct open_how how = {.flags = O_PATH | O_CLOEXEC, .resolve = RESOLVE_IN_ROOT};
    int fd = (int)syscall(SYS_openat2, root, path, &how, sizeof how);
    close(root);
    return fd;
}

/* The path a sockaddr_un names, as the kernel reads it (unix_mkname_bsd:
   up to the first NUL or the address's end), when it is absolute and does
   not start at /proc (the Python code spells /proc/self for the program's
   thread, and records what it refuses); 0 otherwise (an abstract name, a
   relative path: the Python code's). */
static int absolute_path(const unsigned char *raw, int length, char *path)
{
    if (length <= 2 || length > (int)sizeof(struct sockaddr_un) || raw[2] != '/')
        return 0;
    memcpy(path, raw + 2, (size_t)(length - 2));
    path[length - 2] = 0;
    /* Past what stays at the root: "/", "." and ".." (".." at the root is
       the root, RESOLVE_IN_ROOT's too), so that /../proc is seen as /proc. */
    const char *first = path;
    for (;;) {
        if (*first == '/')
            first++;
        else if (first[0] == '.' && (first[1] == '/' || first[1] == 0))
            first++;
        else if (first[0] == '.' && first[1] == '.' && (first[2] == '/' || first[2] == 0))
            first += 2;
        else
            break;
    }
    return strncmp(first, "proc", 4) != 0 || (first[4] != '/' && first[4] != 0);
}

/* A non-blocking Unix socket's connect to an absolute path whose socket
   file's identity (device and handle) is one recorded as bound inside:
   connected here through the O_PATH fd checked (self/fd/N under our own
   /proc, our working directory), never through the path again, as the
   Python code does (Supervisor._decide). Anything else, a socket the policy
   names (its connect is recorded) or any error: the Python code's, from the
   start. */
static enum answer unix_inside(int proc, int listener, const struct seccomp_notif *n,
                               struct kept *k, const unsigned char *raw, int length,
                               const struct names *names, int *sock, int *target, int *result)
{
    char path[sizeof(struct sockaddr_un)];
    if (!absolute_path(raw, length, path))
        return TO_PYTHON;
    *sock = take(k, (int)(int32_t)n->data.args[0]);
    if (*sock < 0 || domain_of(*sock) != AF_UNIX || !nonblocking(*sock))
        return TO_PYTHON;
    *target = open_in_root(proc, (pid_t)n->pid, path);
    struct stat st;
    union {
        struct file_handle fh;
        unsigned char room[sizeof(struct file_handle) + HANDLE_MAX];
    } handle;
    if (*target < 0 || fstat(*target, &st) < 0 || !S_ISSOCK(st.st_mode) ||
        handle_of(*target, &handle.fh) < 0 ||
        recorded(names, (uint64_t)st.st_dev, &handle.fh) != SLOT_BOUND)
        return TO_PYTHON;
    struct sockaddr_un via = {.sun_family = AF_UNIX};
    int used = snprintf(via.sun_path, sizeof via.sun_path, "self/fd/%d", *target);
    return connect_here(listener, n, *sock, &via, (int)offsetof(struct sockaddr_un, sun_path) + used,
                        result);
}

/* The answer to one notification; `*sock` is the socket taken and
   `*target` the socket file opened (each closed by the caller once it has
   answered), `*result` the connect's errno (0: connected) when CONNECTED.

   A thread alone in its group gets "continue" for an IP connect (its fd
   table is its own until its call has looked the fd up; counted before the
   take). Any other thread's connect on a non-blocking IP socket is made
   here, on the socket taken once, to the address read once, as the Python
   code makes it (Supervisor._decide): the kernel never looks the fd or the
   address up again, so another thread's swap changes nothing. A Unix path:
   unix_inside(). A blocking socket goes to the Python code, which hands
   its turn to another receiving thread before a connect that may wait. */
static enum answer decide(int proc, int listener, const struct seccomp_notif *n,
                          const struct names *names, int *sock, int *target, int *result)
{
    /* Only connect() of x86_64 (the filter refuses any other arch), from a
       thread with a TID: anything else, the Python code's (which answers
       listen() and refuses what the filter never sends). */
    if (n->data.nr != __NR_connect || n->data.arch != AUDIT_ARCH_X86_64 || (int32_t)n->pid <= 0)
        return TO_PYTHON;
    unsigned char raw[SOCKADDR_MAX] = {0};
    int length = (int)(int32_t)n->data.args[2];
    if (!read_once(n, raw, length))
        return TO_PYTHON;
    struct kept *k = slot_of((pid_t)n->pid);
    if (!k)
        k = new_slot((pid_t)n->pid);
    if ((raw[0] | raw[1] << 8) == AF_UNIX)
        return unix_inside(proc, listener, n, k, raw, length, names, sock, target, result);
    int by_itself = alone(proc, k);
    *sock = take(k, (int)(int32_t)n->data.args[0]);
    if (*sock < 0 || !inet_may_go(*sock, raw, length, names))
        return TO_PYTHON;
    if (by_itself)
        return GO_ON;
    if (!nonblocking(*sock))
        return TO_PYTHON;
    return connect_here(listener, n, *sock, raw, length, result);
}

/* Decides and answers one notification: 0 when answered (or nobody waits
   any more), 1 when it is the Python code's, -errno when the answer fails. */
static int answer_one(int proc, int listener, const struct seccomp_notif *n,
                      const struct names *names)
{
    int sock = -1, target = -1, result = 0, outcome = 0;
    enum answer answer = decide(proc, listener, n, names, &sock, &target, &result);
    if (answer == TO_PYTHON) {
        outcome = 1;
    } else if (answer != GONE) {
        struct seccomp_notif_resp resp = {.id = n->id};
        if (answer == GO_ON)
            resp.flags = SECCOMP_USER_NOTIF_FLAG_CONTINUE;
        else
            resp.error = -result;
        if (ioctl(listener, SECCOMP_IOCTL_NOTIF_SEND, &resp) < 0 && errno != ENOENT)
            outcome = -errno;
    }
    /* Closed after the answer: the program's thread need not wait for it. */
    if (sock >= 0)
        close(sock);
    if (target >= 0)
        close(target);
    return outcome;
}

#ifndef FAST_CONTINUE_MOCK
/* receive(listener, proc_fd, listened, table, notification, cookie) -> None

   Waits for notifications and answers each that decide() may answer here;
   returns when one needs the Python code, with it in `notification` (a
   writable buffer of sizeof(struct seccomp_notif)). `listened`: the bitmap
   of loopback ports seen with a listener (8192 bytes, read only here);
   `table`: the recorded socket files (BoundTable, rewritten by the Python
   code as programs listen, read here slot by slot under its sequence
   numbers); `cookie`: the sandbox's network namespace's.
   Raises OSError as the ioctls fail (EINTR and ENOENT, a call that ended
   before it was read or answered, are not errors). */
static PyObject *receive(PyObject *self, PyObject *args)
{
    int listener, proc;
    unsigned long long cookie;
    Py_buffer listened, table, out;
    if (!PyArg_ParseTuple(args, "iiy*y*w*K", &listener, &proc, &listened, &table, &out, &cookie))
        return NULL;
    struct seccomp_notif n;
    int error = 0;
    if (listened.len != PORT_BITS_BYTES || table.len < TABLE_HEAD ||
        out.len != (Py_ssize_t)sizeof(struct seccomp_notif) || cookie == 0) {
        error = -1;
        goto out;
    }
    struct names names = {listened.buf, table.buf, table.len, cookie};
    Py_BEGIN_ALLOW_THREADS
    for (;;) {
        memset(&n, 0, sizeof n);
        if (ioctl(listener, SECCOMP_IOCTL_NOTIF_RECV, &n) < 0) {
            if (errno == EINTR || errno == ENOENT)
                continue;
            error = errno;
            break;
        }
        int outcome = answer_one(proc, listener, &n, &names);
        if (outcome < 0)
            error = -outcome;
        if (outcome != 0)
            break;
    }
    Py_END_ALLOW_THREADS
    if (!error)
        memcpy(out.buf, &n, sizeof n);
out:
    PyBuffer_Release(&listened);
    PyBuffer_Release(&table);
    PyBuffer_Release(&out);
    if (error < 0) {
        PyErr_SetString(PyExc_ValueError, "receive: a buffer of the wrong size, or no cookie");
        return NULL;
    }
    if (error) {
        errno = error;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"receive", receive, METH_VARARGS,
     "Answer the connects decided here; return with the first that is not."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "fast_continue",
    "The supervisor's compiled answers (stages/helper/supervisor/fast_continue.c).",
    -1, methods,
};

PyMODINIT_FUNC PyInit_fast_continue(void)
{
    return PyModule_Create(&module);    /* kept[] starts free (tid 0) in every thread */
}
#endif
