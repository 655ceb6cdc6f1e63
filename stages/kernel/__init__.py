"""Shared: thin wrappers over the kernel calls more than one stage makes
(namespaces and privileges, mounts, descriptors). No policy here."""
