/* The supervisor's compiled fast path: the connects of IP sockets.

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
#include <linux/seccomp.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
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

/* The socket taken and its address read once, when they are an IP socket
   and an IP address the kernel may be let connect (not a loopback port no
   listener has been seen on: that connect is the Python code's, whose
   refusal is evidence for a hint). -1 (nothing held) otherwise. */
static int inet_socket(struct kept *k, const struct seccomp_notif *n,
                       const unsigned char *listened, unsigned char *raw, int *length)
{
    int sock = take(k, (int)(int32_t)n->data.args[0]);
    if (sock < 0)
        return -1;
    *length = (int)(int32_t)n->data.args[2];
    if (*length >= 2 && *length <= SOCKADDR_MAX) {
        struct iovec local = {raw, (size_t)*length};
        struct iovec remote = {(void *)(uintptr_t)n->data.args[1], (size_t)*length};
        if (process_vm_readv((pid_t)n->pid, &local, 1, &remote, 1, 0) == *length &&
            (raw[0] | raw[1] << 8) != AF_UNIX) {
            int domain = 0;
            socklen_t size = sizeof domain;
            if (getsockopt(sock, SOL_SOCKET, SO_DOMAIN, &domain, &size) == 0 &&
                (domain == AF_INET || domain == AF_INET6)) {
                int port = loopback_port(raw, *length);
                if (port < 0 || (listened[port >> 3] >> (port & 7) & 1))
                    return sock;
            }
        }
    }
    close(sock);
    return -1;
}

/* The answer to one notification; `*sock` is the socket taken (closed by
   the caller once it has answered) and `*result` the connect's errno (0:
   connected) when CONNECTED.

   A thread alone in its group gets "continue" (its fd table is its own
   until its call has looked the fd up; counted before the take). Any other
   thread's connect on a non-blocking IP socket is made here, on the socket
   taken once, to the address read once, after NOTIF_ID_VALID says the
   thread waited all along (its TID named it: the socket and the bytes are
   its own), as the Python code makes it (Supervisor._decide): the kernel
   never looks the fd or the address up again, so another thread's swap
   changes nothing. A blocking socket goes to the Python code, which hands
   its turn to another receiving thread before a connect that may wait. */
static enum answer decide(int proc, int listener, const struct seccomp_notif *n,
                          const unsigned char *listened, int *sock, int *result)
{
    struct kept *k = slot_of((pid_t)n->pid);
    if (!k)
        k = new_slot((pid_t)n->pid);
    int by_itself = alone(proc, k);
    unsigned char raw[SOCKADDR_MAX];
    int length = 0;
    *sock = inet_socket(k, n, listened, raw, &length);
    if (*sock < 0)
        return TO_PYTHON;
    if (by_itself)
        return GO_ON;
    int flags = fcntl(*sock, F_GETFL);
    if (flags < 0 || !(flags & O_NONBLOCK))
        return TO_PYTHON;
    __u64 id = n->id;
    if (ioctl(listener, SECCOMP_IOCTL_NOTIF_ID_VALID, &id) < 0)
        return GONE;
    *result = connect(*sock, (const struct sockaddr *)raw, (socklen_t)length) == 0 ? 0 : errno;
    return CONNECTED;
}

/* receive(listener, proc_fd, listened, notification) -> None

   Waits for notifications and answers each that decide() may answer here;
   returns when one needs the Python code, with it in
   `notification` (a writable buffer of sizeof(struct seccomp_notif)).
   `listened`: the bitmap of loopback ports seen with a listener (8192
   bytes, read only here). Raises OSError as the ioctls fail (EINTR and
   ENOENT, a call that ended before it was read or answered, are not
   errors). */
static PyObject *receive(PyObject *self, PyObject *args)
{
    int listener, proc;
    Py_buffer listened, out;
    if (!PyArg_ParseTuple(args, "iiy*w*", &listener, &proc, &listened, &out))
        return NULL;
    if (listened.len != PORT_BITS_BYTES || out.len != (Py_ssize_t)sizeof(struct seccomp_notif)) {
        PyBuffer_Release(&listened);
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, "receive: a buffer of the wrong size");
        return NULL;
    }
    struct seccomp_notif n;
    int error = 0;
    Py_BEGIN_ALLOW_THREADS
    for (;;) {
        memset(&n, 0, sizeof n);
        if (ioctl(listener, SECCOMP_IOCTL_NOTIF_RECV, &n) < 0) {
            if (errno == EINTR || errno == ENOENT)
                continue;
            error = errno;
            break;
        }
        int sock = -1, result = 0;
        enum answer answer = decide(proc, listener, &n, listened.buf, &sock, &result);
        if (answer == TO_PYTHON) {
            if (sock >= 0)
                close(sock);
            break;
        }
        struct seccomp_notif_resp resp = {.id = n.id};
        if (answer == GO_ON)
            resp.flags = SECCOMP_USER_NOTIF_FLAG_CONTINUE;
        else
            resp.error = -result;
        int sent = answer == GONE ? 0 : ioctl(listener, SECCOMP_IOCTL_NOTIF_SEND, &resp);
        int sent_errno = errno;
        close(sock);        /* after the answer: the program's thread need not wait for it */
        if (sent < 0 && sent_errno != ENOENT) {
            error = sent_errno;
            break;
        }
    }
    Py_END_ALLOW_THREADS
    if (!error)
        memcpy(out.buf, &n, sizeof n);
    PyBuffer_Release(&listened);
    PyBuffer_Release(&out);
    if (error) {
        errno = error;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"receive", receive, METH_VARARGS,
     "Answer the IP connects decided here; return with the first that is not."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "fast_continue",
    "The supervisor's compiled answer to IP connects (stages/helper/fast_continue.c).",
    -1, methods,
};

PyMODINIT_FUNC PyInit_fast_continue(void)
{
    return PyModule_Create(&module);    /* kept[] starts free (tid 0) in every thread */
}
