"""What a sweep writes into its output directory, by name: the results file (``records``), the lock and the config
fingerprint, and the folders earlier results are moved into (``lock``). Torch-free: ``treespec sweep --help`` names
them without importing torch."""

#: one JSON record per finished point (``treespec.bench.sweep.records``)
RESULTS = "results.jsonl"
#: held (``flock``) by the sweep writing the directory, and naming it
LOCK = ".treespec-sweep.lock"
#: the config the results were computed with
FINGERPRINT = "config.json"
#: the prefix of the folder (``replaced-<UTC time>``) a ``--new`` run moves earlier results into
REPLACED = "replaced-"
