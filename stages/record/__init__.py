"""Shared: the record. Event model and writer (`events`), its schema, the
digest chain, run files read back (`runs`, for the recorder's commands and the
learner alike), per-destination totals and text for people."""
