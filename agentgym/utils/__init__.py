"""Utilities every layer may use and that know nothing of envs or policies.

``cache`` (one root for every cache, built under a lock and renamed into place), ``progress`` (rich progress
bars), ``images`` (PNG and image references), ``procfs`` (reading ``/proc``), ``singletons`` (process-wide shared
pools), ``lazy`` (lazy module attributes), ``deprecation`` (old import paths), ``source_tree`` (a checkout's
namespace folders), ``fast_records`` and ``gc_tuning`` (hot-path helpers of the rollout engine), ``durable``
(atomic file replacement and JSONL appends that a full disk cannot tear), ``terminal`` (model and env text made
safe to print on a terminal) and ``coroutines`` (running a coroutine from synchronous code, Ctrl-C safe).
"""
