"""vlcache against vLLM's CPU build, side by side: one driver, one worker process per engine.

Module map: `cases` (the requests, as JSON-able specs), `images` (a spec to a PIL image, the same
in both environments), `schedule` (which request runs when), `protocol` (JSON lines over a
pipe), `vlcache_worker` and `vllm_worker` (one engine each, in its own environment), `samples`
(the CSV), `stats` (per-round ratios), `report` (markdown and plot), `driver` (the run).
"""
