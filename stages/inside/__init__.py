"""Tools that run inside the sandbox, as the program's children, under its
seccomp filter: not stages. They may import shared folders only."""
