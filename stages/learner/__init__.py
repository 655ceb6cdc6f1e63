"""The learner: run files in, a draft policy (TOML) out. Offline; reads files only."""
