/* The bench's reference relay: the fastest plain relay Linux allows without
 * privileges, to set vpnw's tunnels beside (scripts/bench/all.py, "bulk").
 *
 *     splice_relay LISTEN_PORT TARGET_PORT     (both on 127.0.0.1)
 *
 * Each accepted connection gets a connection to the target and one thread per
 * direction; each thread moves its bytes socket -> pipe -> socket with
 * blocking splice(2) through a 1 MiB pipe: no copy into user space, no event
 * loop, no wake-up but the kernel's own. End of stream one way becomes
 * shutdown(SHUT_WR) on the other; the sockets close when both ways ended.
 * Prints "ready" once listening. No policy, no record: a bound, not a proxy. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#define PIPE_SIZE (1 << 20)

struct way { int src, dst; atomic_int *left; };

static void finish(struct way *w) {
    if (atomic_fetch_sub(w->left, 1) == 1) {      /* the last way out closes both */
        close(w->src);
        close(w->dst);
        free(w->left);
    }
    free(w);
}

static void *move(void *arg) {
    struct way *w = arg;
    int p[2];
    if (pipe2(p, O_CLOEXEC) == 0) {
        fcntl(p[1], F_SETPIPE_SZ, PIPE_SIZE);
        for (;;) {
            ssize_t n = splice(w->src, NULL, p[1], NULL, PIPE_SIZE, SPLICE_F_MOVE | SPLICE_F_MORE);
            if (n <= 0)
                break;
            while (n > 0) {
                ssize_t m = splice(p[0], NULL, w->dst, NULL, n, SPLICE_F_MOVE | SPLICE_F_MORE);
                if (m <= 0)
                    goto out;
                n -= m;
            }
        }
    out:
        close(p[0]);
        close(p[1]);
    }
    shutdown(w->dst, SHUT_WR);
    finish(w);
    return NULL;
}

static int start(int src, int dst, atomic_int *left) {
    pthread_t t;
    struct way *w = malloc(sizeof *w);
    w->src = src, w->dst = dst, w->left = left;
    if (pthread_create(&t, NULL, move, w) != 0)
        return -1;
    return pthread_detach(t);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: splice_relay LISTEN_PORT TARGET_PORT\n");
        return 2;
    }
    struct sockaddr_in at = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct sockaddr_in to = at;
    at.sin_port = htons(atoi(argv[1]));
    to.sin_port = htons(atoi(argv[2]));
    int one = 1, ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(ls, (struct sockaddr *)&at, sizeof at) != 0 || listen(ls, 4096) != 0) {
        perror("splice_relay: listen");
        return 1;
    }
    printf("ready\n");
    fflush(stdout);
    for (;;) {
        int c = accept4(ls, NULL, NULL, SOCK_CLOEXEC);
        if (c < 0)
            continue;
        int u = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (connect(u, (struct sockaddr *)&to, sizeof to) != 0) {
            close(c);
            close(u);
            continue;
        }
        setsockopt(u, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        atomic_int *left = malloc(sizeof *left);
        atomic_init(left, 2);
        if (start(c, u, left) != 0 || start(u, c, left) != 0) {
            fprintf(stderr, "splice_relay: no thread\n");
            return 1;
        }
    }
}
