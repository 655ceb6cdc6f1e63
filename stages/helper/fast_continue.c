/* The supervisor's compiled fast path: the connects it can answer without Python.

   stages/helper/unix_supervisor.py answers every connect() of the program.
   Most are TCP connects: of a program of one thread (ab, curl, a Python
   client), which it lets the kernel go on with (SECCOMP_USER_NOTIF_FLAG_
   CONTINUE), or of a program of many (Node, Go, tokio, Chromium), whose
   connect it makes itself on the socket it took. Made in Python, either
   answer costs tens of microseconds of interpreter per connect, and the
   program's thread waits for all of them.

   receive() waits for notifications with the GIL let go, and answers here,
   in C, those the Python code would answer the same way, by the same tests
   in the same order (Supervisor._decide and _may_go_on, the argument in
   docs/security.md "Unix sockets by origin"):
     1. the thread group is counted (the link count of a kept
        /proc/TID/task, less two) before the socket is taken;
     2. the socket taken with pidfd_getfd (a kept PIDFD_THREAD pidfd);
     3. the address, read once (process_vm_readv), 2 to 128 bytes, whose
        family is not AF_UNIX;
     4. the socket's SO_DOMAIN is AF_INET or AF_INET6;
     5. the address is not loopback at a port no listener has been seen on
        (the Python code's bitmap of such ports, 65536 bits, only ever set);
     6. a thread alone in its group: "continue". Another: when the socket is
        non-blocking (a connect that cannot wait), NOTIF_ID_VALID, then the
        connect made here on the socket taken, to the bytes read, and its
        result is the answer (decide() below).
   A non-blocking Unix socket's connect to an absolute path (not under
   /proc) whose socket file is bound by a listener of the sandbox's network
   namespace is made here too, through the descriptor checked
   (unix_inside() below); every other Unix connect, and every refusal, is
   the Python code's.
   Anything else (and any error on the way) returns the notification to the
   Python code untouched, which decides it from the start as it does where
   this module did not build: this path never decides anything else, so it
   only ever answers what the Python code would answer, and as it would.

   Kept fds by TID are sound for the reasons Threads in unix_supervisor.py
   gives: each names one thread for life; a thread that is gone makes
   pidfd_getfd fail and its task directory count no thread. They are this
   OS thread's own (each receiving thread has its own table), never shared. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <linux/netlink.h>
#include <linux/openat2.h>
#include <linux/rtnetlink.h>
#include <linux/seccomp.h>
#include <linux/sock_diag.h>
#include <linux/unix_diag.h>
#include <netinet/tcp.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <stddef.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
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
    if (k->pidfd >= 0)
        close(k->pidfd);
    if (k->task >= 0)
        close(k->task);
    k->tid = 0;
    k->pidfd = k->task = -1;
}

static struct kept *slot_of(pid_t tid)
{
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
   (loopback_port in unix_supervisor.py). */
static int loopback_port(const unsigned char *raw, int len)
{
    static const unsigned char v4[4] = {127, 0, 0, 1};
    static const unsigned char v6[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    static const unsigned char mapped[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff,
                                             127, 0, 0, 1};
    int family = raw[0] | raw[1] << 8;
    int port = raw[2] << 8 | raw[3];
    if (family == AF_INET && len >= 8 && memcmp(raw + 4, v4, 4) == 0)
        return port;
    if (family == AF_INET6 && len >= 24 &&
        (memcmp(raw + 8, v6, 16) == 0 || memcmp(raw + 8, mapped, 16) == 0))
        return port;
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

/* An IP socket and an IP address the kernel may be let connect: not a
   loopback port no listener has been seen on (that connect is the Python
   code's, whose refusal is evidence for a hint). */
static int inet_may_go(int sock, const unsigned char *raw, int length,
                       const unsigned char *listened)
{
    int domain = domain_of(sock);
    if (domain != AF_INET && domain != AF_INET6)
        return 0;
    int port = loopback_port(raw, length);
    return port < 0 || (listened[port >> 3] >> (port & 7) & 1);
}

/* What receive() was given to decide by: the loopback ports seen with a
   listener, and the sockets the policy names ((st_dev, st_ino) pairs). */
struct names {
    const unsigned char *listened;
    const uint64_t *named;
    Py_ssize_t named_count;
};

static __thread int diag = -1;          /* this OS thread's sock_diag socket */

/* Is (dev, ino) the socket file of a listener of the sandbox's network
   namespace? One sock_diag dump of its listening Unix sockets with their
   files (UDIAG_SHOW_VFS), as unix_diag.listening_files; the netlink socket
   is made here, in the supervisor, which is in that namespace for life.
   0 as well when the dump fails (the Python code then decides). */
static int listened_inside(dev_t dev, ino_t ino)
{
    if (diag < 0)
        diag = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (diag < 0)
        return 0;
    struct {
        struct nlmsghdr head;
        struct unix_diag_req req;
    } ask = {
        .head = {.nlmsg_len = sizeof ask, .nlmsg_type = SOCK_DIAG_BY_FAMILY,
                 .nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP, .nlmsg_seq = 1},
        .req = {.sdiag_family = AF_UNIX, .udiag_states = 1 << TCP_LISTEN,
                .udiag_show = UDIAG_SHOW_VFS},
    };
    int found = 0;
    if (send(diag, &ask, sizeof ask, 0) == (ssize_t)sizeof ask) {
        static __thread long buffer[65536 / sizeof(long)];
        for (;;) {
            ssize_t got = recv(diag, buffer, sizeof buffer, 0);
            if (got <= 0)
                break;
            int left = (int)got;
            for (struct nlmsghdr *h = (struct nlmsghdr *)buffer; NLMSG_OK(h, left);
                 h = NLMSG_NEXT(h, left)) {
                if (h->nlmsg_type == NLMSG_DONE)
                    return found;
                if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY ||
                    h->nlmsg_len < NLMSG_LENGTH(sizeof(struct unix_diag_msg)))
                    goto broken;    /* NLMSG_ERROR among them */
                int attrs = (int)(h->nlmsg_len - NLMSG_LENGTH(sizeof(struct unix_diag_msg)));
                struct rtattr *a = (struct rtattr *)((char *)NLMSG_DATA(h) +
                                                     NLMSG_ALIGN(sizeof(struct unix_diag_msg)));
                for (; RTA_OK(a, attrs); a = RTA_NEXT(a, attrs)) {
                    const struct unix_diag_vfs *vfs = RTA_DATA(a);
                    if (a->rta_type == UNIX_DIAG_VFS && RTA_PAYLOAD(a) >= sizeof *vfs &&
                        vfs->udiag_vfs_ino == ino && vfs->udiag_vfs_dev >> 20 == major(dev) &&
                        (vfs->udiag_vfs_dev & 0xFFFFF) == minor(dev))
                        found = 1;
                }
            }
        }
    }
broken:             /* what is left of the dump would answer the next: a new socket */
    close(diag);
    diag = -1;
    return 0;
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
    const char *first = path;
    while (*first == '/' || (first[0] == '.' && (first[1] == '/' || first[1] == 0)))
        first++;
    return strncmp(first, "proc", 4) != 0 || (first[4] != '/' && first[4] != 0);
}

static int named(const struct names *names, const struct stat *st)
{
    for (Py_ssize_t i = 0; i < names->named_count; i++)
        if (names->named[2 * i] == (uint64_t)st->st_dev && names->named[2 * i + 1] == (uint64_t)st->st_ino)
            return 1;
    return 0;
}

/* A non-blocking Unix socket's connect to an absolute path whose socket
   file is bound by a listener of the sandbox's network namespace: connected
   here through the O_PATH fd checked (self/fd/N under our own /proc, our
   working directory), never through the path again, as the Python code
   does (Supervisor._unix_target). Anything else, a socket the policy names
   (its connect is recorded) or any error: the Python code's, from the start. */
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
    if (*target < 0 || fstat(*target, &st) < 0 || !S_ISSOCK(st.st_mode) ||
        (uint64_t)st.st_ino >> 32 || named(names, &st) || !listened_inside(st.st_dev, st.st_ino))
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
    unsigned char raw[SOCKADDR_MAX];
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
    if (*sock < 0 || !inet_may_go(*sock, raw, length, names->listened))
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

/* receive(listener, proc_fd, listened, named, notification) -> None

   Waits for notifications and answers each that decide() may answer here;
   returns when one needs the Python code, with it in `notification` (a
   writable buffer of sizeof(struct seccomp_notif)). `listened`: the bitmap
   of loopback ports seen with a listener (8192 bytes, read only here);
   `named`: the policy's sockets, (st_dev, st_ino) as native 64-bit pairs.
   Raises OSError as the ioctls fail (EINTR and ENOENT, a call that ended
   before it was read or answered, are not errors). */
static PyObject *receive(PyObject *self, PyObject *args)
{
    int listener, proc;
    Py_buffer listened, named, out;
    if (!PyArg_ParseTuple(args, "iiy*y*w*", &listener, &proc, &listened, &named, &out))
        return NULL;
    struct seccomp_notif n;
    int error = 0;
    if (listened.len != PORT_BITS_BYTES || named.len % (2 * sizeof(uint64_t)) ||
        out.len != (Py_ssize_t)sizeof(struct seccomp_notif)) {
        error = -1;
        goto out;
    }
    struct names names = {listened.buf, named.buf, named.len / (Py_ssize_t)(2 * sizeof(uint64_t))};
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
    PyBuffer_Release(&named);
    PyBuffer_Release(&out);
    if (error < 0) {
        PyErr_SetString(PyExc_ValueError, "receive: a buffer of the wrong size");
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
    "The supervisor's compiled answers (stages/helper/fast_continue.c).",
    -1, methods,
};

PyMODINIT_FUNC PyInit_fast_continue(void)
{
    return PyModule_Create(&module);    /* kept[] starts free (tid 0) in every thread */
}
