"""Benchmarks: time-to-first-token side by side, memory, and a load run against the server.

- images.py: synthetic images of an exact image-token count
- models.py: random-weight models of real sizes (optionally fewer layers), or a checkpoint
- plans.py: a stand-in recompute plan for random models (a monotone ramp of a given budget)
- timing.py: the interleaved rounds, per-round ratios, medians and spreads
- memory.py: peak resident memory of one call
- reference.py: plain `transformers` generate on the full prompt, the user's alternative
- ttft.py: one sweep over image sizes and policies; rows for the report
- report.py: CSV, markdown tables and plots (and re-reading the samples to redo them)
- profile.py: one request under torch.profiler: the engine's stage times and the top operators
- server.py: a bounded load run against `vlcache serve` on loopback
"""
