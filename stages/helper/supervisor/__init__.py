"""The Unix-socket supervisor: it answers every connect() and listen() the program makes.

    judge.py            pure: a notified call's facts in, the answer out
    shell.py            the process shell: receiving threads, do what the judge says
    live_call.py        one notified call, read from the program's thread as the judge asks
    program_threads.py  the kept handles on the program's threads; their /proc
    program_paths.py    a path found as the program's thread finds it
    bound.py            the socket files a path may reach (bound inside, named by the policy)
    reports.py          what the supervisor reports before the program hears its answer
    compiled.py         which path answers "continue": fast_continue.c or the shell
    fast_continue.c     the compiled path: the answers it gives as the judge would
    launch.py           the helper's side: can it run, the policy's sockets, spawn

The program's seccomp filter sends each connect() and listen() here (SECCOMP_RET_USER_NOTIF);
the program's thread waits until we answer. We take the program's socket
(pidfd_getfd), read its address once, decide on what we read, make the
connect() ourselves on that same socket and answer with its result: were the
kernel to go on with the program's own call (SECCOMP_USER_NOTIF_FLAG_CONTINUE),
another thread could change the fd or the address between our look and the
kernel's. The one exception: an IP socket of a thread alone in its group (no
other task can change its fd table while it waits; the filter refuses a
process that shares it) is let go on. The design, and what a program could
try against it, is in docs/security.md, "Unix sockets by origin".

What is allowed (judge.py decides, on what the shell reads):
- a socket of another family (TCP, UDP, netlink) made in the sandbox's
  network namespace (SO_NETNS_COOKIE): connected as asked (or let go on);
  the network namespace is that boundary;
- a path whose socket file's identity (its device and file handle) is one
  recorded at a listen() of a Unix socket made in the sandbox (the file its
  bind made, SIOCUNIXFILE), or is a socket the policy's [unix] allow names
  (opened once, when the run starts);
- an abstract name, when the socket was made in the sandbox's network
  namespace (abstract names are per namespace).
A listen() is let go on once its socket's file is recorded. Anything else
gets EPERM, and a UnixRefused status message first (a call the filter
never sends: EPERM alone).

This runs as a process of its own, forked by the helper (P) inside the
sandbox's user, network and mount namespaces but outside its PID namespace
(the program cannot see, signal or trace it), non-dumpable. It resolves paths
in the program's root through the /proc of its own PID namespace, opened
before init mounts the sandbox's over it.
"""
