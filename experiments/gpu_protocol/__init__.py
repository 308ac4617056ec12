"""The GPU protocol's parts (``experiments/bench_gpu.py`` is its command): the random-weight models
(``models``), the run's settings and timed calls (``bench``), the trees it runs (``shapes``), the profiler's
readings (``profiling``), the phases (``phases``; the draft level's levers: ``levers``; the shape sweep:
``sweep``) and the results it writes after every phase (``report``)."""
